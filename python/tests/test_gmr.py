"""Tests of the gmr package on the simulated device (no GPU, no framework).

The process-wide runtime is configured once, here: a 1 GiB simulated device,
policy direct, and a 64 MiB limit counting reserved bytes.  The framework
entry points (gmr_torch_alloc, gmr_cupy_malloc...) are called through ctypes
exactly as PyTorch and CuPy call them.  Tests that need another configuration
run in a child process.
"""

import ctypes
import os
import subprocess
import sys
import tempfile
import textwrap
import types
import unittest

MiB = 1 << 20
_tmp = tempfile.TemporaryDirectory(prefix="gmr-pytest-")
CONFIG = os.path.join(_tmp.name, "sim.yaml")
with open(CONFIG, "w") as f:
    f.write("device: {backend: sim, capacity: 1GiB}\n"
            "policy: direct\n"
            "limit: {bytes: 64MiB, counts: reserved}\n")

import gmr  # noqa: E402

gmr.configure(CONFIG)
lib = gmr._library()


def child(code, config_text=None, env=None):
    """Run `code` in a fresh interpreter; returns (rc, stdout+stderr)."""
    e = dict(os.environ)
    if config_text is not None:
        path = os.path.join(_tmp.name, "child-%d.yaml" % abs(hash(config_text)))
        with open(path, "w") as f:
            f.write(config_text)
        e["GMR_CONFIG"] = path
    e.update(env or {})
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    return p.returncode, p.stdout.decode(errors="replace")


class Library(unittest.TestCase):
    def test_found_through_GMR_LIBRARY(self):
        self.assertEqual(gmr.library_path(), os.environ["GMR_LIBRARY"])

    def test_a_missing_library_names_the_variable(self):
        rc, out = child("import gmr; gmr.stats(0)", env={"GMR_LIBRARY": "/nonexistent/libgmr.so"})
        self.assertNotEqual(rc, 0)
        self.assertIn("set GMR_LIBRARY", out)
        self.assertIn("/nonexistent/libgmr.so", out)

    def test_policy_and_backend(self):
        self.assertEqual(gmr.policy(0), "limit(direct)")
        self.assertEqual(lib.gmr_runtime_backend(gmr._runtime(0)), b"sim")


class Configure(unittest.TestCase):
    def test_a_bad_file_names_line_and_column(self):
        bad = os.path.join(_tmp.name, "bad.yaml")
        with open(bad, "w") as f:
            f.write("policy: direct\nlimit: {bytes: lots}\n")
        with self.assertRaises(ValueError) as cm:
            gmr.configure(bad)
        self.assertIn("bad.yaml:2:", str(cm.exception))

    def test_a_missing_file(self):
        with self.assertRaises(ValueError) as cm:
            gmr.configure(os.path.join(_tmp.name, "nope.yaml"))
        self.assertIn("nope.yaml", str(cm.exception))

    def test_no_change_once_the_runtime_exists(self):
        gmr.stats(0)
        other = os.path.join(_tmp.name, "other.yaml")
        with open(other, "w") as f:
            f.write("device: {backend: sim}\npolicy: direct\n")
        with self.assertRaises(RuntimeError):
            gmr.configure(other)
        self.assertEqual(gmr.configure(CONFIG), CONFIG)  # the same file is fine

    def test_bad_device(self):
        with self.assertRaises(ValueError):
            gmr.stats(-1)


class TorchHooks(unittest.TestCase):
    def test_alloc_free(self):
        before = gmr.stats(0)
        p = lib.gmr_torch_alloc(3 * MiB, 0, None)
        self.assertTrue(p)
        s = gmr.stats(0)
        self.assertEqual(s["allocated_bytes"], before["allocated_bytes"] + 3 * MiB)
        self.assertEqual(s["reserved_bytes"], before["reserved_bytes"] + 3 * MiB)
        self.assertEqual(s["num_allocs"], before["num_allocs"] + 1)
        lib.gmr_torch_free(p, 3 * MiB, 0, None)
        s = gmr.stats(0)
        self.assertEqual(s["allocated_bytes"], before["allocated_bytes"])
        self.assertEqual(s["num_frees"], before["num_frees"] + 1)

    def test_size_zero_allocates_nothing(self):
        before = gmr.stats(0)["num_allocs"]
        self.assertIsNone(lib.gmr_torch_alloc(0, 0, None))
        self.assertEqual(gmr.stats(0)["num_allocs"], before)

    def test_refusal_without_torch_is_null_with_a_reason(self):
        self.assertNotIn("torch", sys.modules)
        self.assertIsNone(lib.gmr_torch_alloc(65 * MiB, 0, None))
        why = lib.gmr_hooks_last_error().decode()
        self.assertIn("Tried to allocate 65.00 MiB", why)
        self.assertIn("total capacity of 64.00 MiB", why)  # the cap seen as the device

    def test_a_foreign_free_changes_nothing(self):
        before = gmr.stats(0)
        lib.gmr_torch_free(ctypes.c_void_p(0x1234), 16, 0, None)
        self.assertEqual(gmr.stats(0)["num_frees"], before["num_frees"])

    def test_use_in_torch_needs_torch(self):
        try:
            import torch  # noqa: F401
            self.skipTest("PyTorch is installed")
        except ImportError:
            pass
        with self.assertRaises(ImportError) as cm:
            gmr.use_in_torch()
        self.assertIn("needs PyTorch", str(cm.exception))


class OnePoolOneLimit(unittest.TestCase):
    """Torch's and CuPy's entry points share one runtime, so one 64 MiB cap."""

    def test_shared_cap(self):
        base = gmr.stats(0)["reserved_bytes"]
        self.assertEqual(base, 0)
        t = lib.gmr_torch_alloc(40 * MiB, 0, None)
        c = lib.gmr_cupy_malloc(None, 20 * MiB, 0)
        self.assertTrue(t and c)
        self.assertEqual(gmr.stats(0)["reserved_bytes"], 60 * MiB)
        self.assertIsNone(lib.gmr_cupy_malloc(None, 10 * MiB, 0), "60 + 10 MiB > 64 MiB")
        why = lib.gmr_hooks_last_error().decode()
        self.assertIn("Tried to allocate 10.00 MiB", why)
        self.assertIn("total capacity of 64.00 MiB of which 4.00 MiB is free", why)
        lib.gmr_torch_free(t, 40 * MiB, 0, None)
        c2 = lib.gmr_cupy_malloc(None, 10 * MiB, 0)
        self.assertTrue(c2, "fits once torch's 40 MiB are back")
        self.assertEqual(gmr.stats(0)["reserved_bytes"], 30 * MiB)
        lib.gmr_cupy_free(None, c, 0)
        lib.gmr_cupy_free(None, c2, 0)
        self.assertEqual(gmr.stats(0)["reserved_bytes"], 0)
        self.assertEqual(gmr.stats(0)["limit_bytes"], 64 * MiB)

    def test_cupy_size_zero(self):
        self.assertIsNone(lib.gmr_cupy_malloc(None, 0, 0))


def _address(name):
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


class FrameworkWiring(unittest.TestCase):
    """use_in_torch and use_in_cupy against stand-ins with PyTorch's and
    CuPy's interfaces (CUDAPluggableAllocator, CFunctionAllocator): the right
    functions are registered, and CuPy's refusals become its OutOfMemoryError."""

    def _install(self, modules):
        saved = {k: sys.modules.get(k) for k in modules}
        sys.modules.update(modules)

        def restore():
            for k, v in saved.items():
                if v is None:
                    sys.modules.pop(k, None)
                else:
                    sys.modules[k] = v
        self.addCleanup(restore)

    def test_use_in_torch(self):
        changed = []

        class Native:
            calls = {}

            def set_reset_fn(self, p):
                self.calls["reset"] = p

            def set_record_stream_fn(self, p):
                self.calls["record_stream"] = p

        class Pluggable:  # torch.cuda.memory.CUDAPluggableAllocator
            def __init__(self, path, alloc_name, free_name):
                so = ctypes.CDLL(path)  # what PyTorch does with the path
                self.alloc = ctypes.cast(getattr(so, alloc_name), ctypes.c_void_p).value
                self.free = ctypes.cast(getattr(so, free_name), ctypes.c_void_p).value
                self.native = Native()

            def allocator(self):
                return self.native

        torch = types.ModuleType("torch")
        torch.cuda = types.SimpleNamespace(memory=types.SimpleNamespace(
            CUDAPluggableAllocator=Pluggable, change_current_allocator=changed.append))
        self._install({"torch": torch})
        alloc = gmr.use_in_torch(CONFIG, adapter="pluggable")
        self.assertEqual(changed, [alloc])
        self.assertEqual(alloc.alloc, _address("gmr_torch_alloc"))
        self.assertEqual(alloc.free, _address("gmr_torch_free"))
        self.assertEqual(alloc.native.calls, {"reset": _address("gmr_torch_empty_cache"),
                                              "record_stream": _address("gmr_torch_record_stream")})

    def test_use_in_torch_falls_back_when_native_cannot_build(self):
        """The default adapter needs torch's C++ headers: a torch without
        them (this stand-in) gives one warning and the pluggable path."""
        changed = []

        class Pluggable:
            def __init__(self, path, alloc_name, free_name):
                pass

            def allocator(self):
                return types.SimpleNamespace()

        torch = types.ModuleType("torch")
        torch.cuda = types.SimpleNamespace(memory=types.SimpleNamespace(
            CUDAPluggableAllocator=Pluggable, change_current_allocator=changed.append))
        self._install({"torch": torch})
        saved = os.environ.pop("GMR_TORCH_ADAPTER", None)
        self.addCleanup(lambda: saved is None or os.environ.__setitem__("GMR_TORCH_ADAPTER", saved))
        gmr._torch_fallback_warned = False
        with self.assertWarns(RuntimeWarning) as cm:
            alloc = gmr.use_in_torch(CONFIG)
        self.assertIn("falling back to the pluggable adapter", str(cm.warning))
        self.assertEqual(changed, [alloc])
        from gmr import _torch
        with self.assertRaises(_torch.BuildError):
            gmr.use_in_torch(CONFIG, adapter="native")
        with self.assertRaises(ValueError):
            gmr.use_in_torch(CONFIG, adapter="cuda")

    def test_use_in_cupy(self):
        installed = []

        class OutOfMemoryError(MemoryError):
            def __init__(self, size, total, limit=0):
                super().__init__(size, total, limit)
                self.size, self.total, self.limit = size, total, limit

        class CFunctionAllocator:  # cupy.cuda.memory.CFunctionAllocator
            def __init__(self, param, malloc_func, free_func, owner):
                self.m = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                          ctypes.c_int)(malloc_func)
                self.f = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p,
                                          ctypes.c_int)(free_func)
                self.owner = owner

            def malloc(self, size):
                ptr = (self.m(None, size, 0) or 0) if size else 0
                return types.SimpleNamespace(ptr=ptr, free=lambda: self.f(None, ptr, 0))

        cupy = types.ModuleType("cupy")
        cuda = types.ModuleType("cupy.cuda")
        memory = types.ModuleType("cupy.cuda.memory")
        memory.CFunctionAllocator, memory.OutOfMemoryError = CFunctionAllocator, OutOfMemoryError
        cuda.memory, cuda.set_allocator = memory, installed.append
        cuda.runtime = types.SimpleNamespace(getDevice=lambda: 0)
        cupy.cuda = cuda
        self._install({"cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.memory": memory})

        malloc = gmr.use_in_cupy(CONFIG)
        self.assertEqual(installed, [malloc])
        before = gmr.stats(0)["allocated_bytes"]
        mem = malloc(2 * MiB)
        self.assertNotEqual(mem.ptr, 0)
        self.assertEqual(gmr.stats(0)["allocated_bytes"], before + 2 * MiB)
        mem.free()
        self.assertEqual(gmr.stats(0)["allocated_bytes"], before)
        with self.assertRaises(OutOfMemoryError) as cm:
            malloc(100 * MiB)
        self.assertEqual((cm.exception.size, cm.exception.limit), (100 * MiB, 64 * MiB))
        self.assertIn("Tried to allocate 100.00 MiB", str(cm.exception.__cause__))


class Reports(unittest.TestCase):
    def test_summary(self):
        text = gmr.summary(0)
        self.assertIn("64.00 MiB", text)  # the limit policy's line

    def test_snapshot(self):
        path = os.path.join(_tmp.name, "snap.pickle")
        if not hasattr(lib, "gmr_snapshot_write"):
            with self.assertRaises(NotImplementedError):
                gmr.snapshot(path)
            return
        p = lib.gmr_torch_alloc(MiB, 0, None)
        try:
            gmr.snapshot(path)
        finally:
            lib.gmr_torch_free(p, MiB, 0, None)
        import pickle

        with open(path, "rb") as f:
            snap = pickle.load(f)
        self.assertIn("device_traces", snap)
        live = [b for seg in snap["segments"] for b in seg["blocks"]
                if b["state"] == "active_allocated"]
        self.assertEqual([(b["size"], b["requested_size"]) for b in live], [(MiB, MiB)],
                         "the one live 1 MiB block")

    def test_snapshot_to_a_bad_path(self):
        if not hasattr(lib, "gmr_snapshot_write"):
            self.skipTest("no gmr_snapshot_write in this libgmr")
        with self.assertRaises(OSError):
            gmr.snapshot("/nonexistent-dir/snap.pickle")


class CachingPolicy(unittest.TestCase):
    """PyTorch's own figures through the torch entry points, when the caching
    policy is in this libgmr (a child process: one configuration each)."""

    def test_small_request(self):
        code = """
            import gmr
            lib = gmr._library()
            p = lib.gmr_torch_alloc(1000, 0, None)
            s = gmr.stats(0)
            print(s["allocated_bytes.all.current"], s["reserved_bytes.all.current"],
                  s["requested_bytes.all.current"], s["segment.all.current"])
            lib.gmr_torch_free(p, 1000, 0, None)
            lib.gmr_torch_empty_cache()
            s = gmr.stats(0)
            print(s["reserved_bytes.all.current"], s["num_device_free"] if "num_device_free" in s else 1)
        """
        rc, out = child(code, "device: {backend: sim, capacity: 1GiB}\npolicy: caching\n")
        if rc != 0 and "unknown policy 'caching'" in out:
            self.skipTest("the caching policy is not in this libgmr")
        self.assertEqual(rc, 0, out)
        lines = out.split("\n")
        # 1000 bytes round to 1024; a small request gets a 2 MiB segment.
        self.assertEqual(lines[0], "1024 2097152 1000 1")
        # empty_cache (torch.cuda.empty_cache) returns the segment.
        self.assertEqual(lines[1].split()[0], "0")


class Hardening(unittest.TestCase):
    """Issue 15: device ordinals past a C int, a configuration that fails to
    build, errno of a failed write, bytes paths."""

    def test_a_device_past_a_c_int_is_refused(self):
        for bad in (2**32, 2**31):
            with self.assertRaises(ValueError, msg=repr(bad)):
                gmr.stats(bad)
        for bad in (True, 1.0):
            with self.assertRaises(TypeError, msg=repr(bad)):
                gmr.stats(bad)

    def test_configure_after_a_failed_runtime(self):
        good = os.path.join(_tmp.name, "good.yaml")
        with open(good, "w") as f:
            f.write("device: {backend: sim}\npolicy: direct\n")
        code = """
            import gmr
            try:
                gmr.stats(0)
            except gmr.GmrError as e:
                print("refused:", e)
            gmr.configure(%r)
            print(gmr.policy(0))
        """ % good
        # loads, but no simulator has 5 PiB: the runtime cannot be built
        rc, out = child(code, "device: {backend: sim, capacity: 5PiB}\npolicy: caching\n")
        self.assertEqual(rc, 0, out)
        self.assertIn("refused:", out)
        self.assertEqual(out.strip().split("\n")[-1], "direct")

    def test_a_failed_write_keeps_errno(self):
        with self.assertRaises(OSError) as cm:
            gmr.snapshot("/nonexistent-dir/snap.pickle")
        self.assertEqual(cm.exception.errno, 2)  # ENOENT
        self.assertIn("No such file or directory", str(cm.exception))

    def test_bytes_paths(self):
        self.assertEqual(gmr.configure(CONFIG.encode()), CONFIG)
        if hasattr(lib, "gmr_snapshot_write"):
            out = os.path.join(_tmp.name, "bytes.pickle")
            gmr.snapshot(out.encode())
            self.assertTrue(os.path.getsize(out) > 0)


SLEEP_CONFIG = ("device: {backend: sim, capacity: 1GiB, host_backed: true}\n"
                "policy: {name: caching, pytorch_alloc_conf: \"expandable_segments:True\"}\n")


class SleepWake(unittest.TestCase):
    """gmr.region, gmr.sleep and gmr.wake on a host-backed simulated device,
    through the PyTorch entry point (docs/sleep-wake.md)."""

    def test_contents_kept_across_cycles(self):
        rc, out = child("""
            import ctypes, gmr
            lib = gmr._library()
            MiB = 1 << 20
            with gmr.region("weights"):
                ps = [lib.gmr_torch_alloc(n, 0, None) for n in (4096, 3 * MiB + 5, 9 * MiB)]
            other = lib.gmr_torch_alloc(MiB, 0, None)
            for k, p in enumerate(ps):
                ctypes.memset(p, 17 + k, 4096)
            for cycle in range(20):
                gmr.sleep("weights", mode="offload")
                t = gmr.tag_info("weights")
                assert t["asleep"] and t["mode"] == "offload" and t["mapped_bytes"] == 0, t
                assert t["sleeping_bytes"] > 0 and t["offloaded_bytes"] > 0, t
                assert gmr.stats(0)["tag.weights.sleeping_bytes"] == t["sleeping_bytes"]
                gmr.sleep("weights")  # twice: nothing happens
                gmr.wake("weights")
                for k, p in enumerate(ps):
                    assert ctypes.string_at(p, 4096) == bytes([17 + k]) * 4096, (cycle, k)
            assert not gmr.tag_info("weights")["asleep"]
            gmr.sleep("weights", mode="discard")
            assert gmr.tag_info("weights")["offloaded_bytes"] == 0
            gmr.wake("weights")
            try:
                gmr.wake("nope")
            except gmr.GmrError as e:
                print("refused:", e)
            for p, n in zip(ps, (4096, 3 * MiB + 5, 9 * MiB)):
                lib.gmr_torch_free(p, n, 0, None)
            lib.gmr_torch_free(other, MiB, 0, None)
            print("ok")
        """, config_text=SLEEP_CONFIG)
        self.assertEqual(rc, 0, out)
        self.assertIn("refused:", out)
        self.assertIn("no tag 'nope'", out)
        self.assertEqual(out.strip().split("\n")[-1], "ok")

    def test_all_threads(self):
        rc, out = child("""
            import ctypes, threading, gmr
            lib = gmr._library()
            MiB = 1 << 20
            got = []
            def work():  # a thread of the framework's own, as XLA's
                p = lib.gmr_torch_alloc(3 * MiB, 0, None)
                ctypes.memset(p, 0x5a, 3 * MiB)
                got.append(p)
            with gmr.region("jax", all_threads=True):
                t = threading.Thread(target=work)
                t.start()
                t.join()
            before = gmr.tag_info("jax")["mapped_bytes"]
            assert before >= 3 * MiB, gmr.tag_info("jax")
            outside = lib.gmr_torch_alloc(3 * MiB, 0, None)  # after the block: not tagged
            assert gmr.tag_info("jax")["mapped_bytes"] == before, gmr.tag_info("jax")
            gmr.sleep("jax", mode="offload")
            assert gmr.tag_info("jax")["mapped_bytes"] == 0
            gmr.wake("jax")
            assert ctypes.string_at(got[0], 3 * MiB) == b"\x5a" * (3 * MiB)
            lib.gmr_torch_free(got[0], 3 * MiB, 0, None)
            lib.gmr_torch_free(outside, 3 * MiB, 0, None)
            print("ok")
        """, config_text=SLEEP_CONFIG)
        self.assertEqual(rc, 0, out)
        self.assertEqual(out.strip().split("\n")[-1], "ok")

    def test_bad_arguments(self):
        with self.assertRaises(ValueError):
            gmr.sleep("weights", mode="later")
        with self.assertRaises(ValueError):
            gmr.sleep("weights", mode="discard", keep_host=True)
        with self.assertRaises(ValueError):
            gmr.region("")
        with self.assertRaises(TypeError):
            gmr.region(3)


if __name__ == "__main__":
    unittest.main()
