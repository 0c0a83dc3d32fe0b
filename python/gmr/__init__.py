"""gmr from Python: PyTorch and CuPy allocate through gmr, and gmr reports.

    import gmr
    gmr.use_in_torch("config/pytorch.yaml")   # before the first CUDA tensor
    gmr.use_in_cupy()                         # same runtime, same pool
    ...
    gmr.stats(0)["allocated_bytes.all.current"]
    print(gmr.summary(0))
    gmr.snapshot("snap.pickle")               # torch.cuda.memory._snapshot() format

Every framework in the process allocates from gmr's process-wide runtime of
the device (gmr_default_runtime), built from the YAML file named by
GMR_CONFIG.  `config` arguments set GMR_CONFIG; they must come before the
first allocation, since a runtime is built once.  Programs that allocate with
cudaMalloc/cuMemAlloc need no call: LD_PRELOAD=libgmr-preload.so routes them
(docs/frameworks.md says which frameworks that covers).

Only ctypes: nothing is compiled beyond libgmr itself (see _lib.py for where
the library is looked up).
"""

import ctypes
import os
import tempfile
import threading

from ._lib import STAT_CB, GmrError, Stats, _Error, libc, load

__all__ = [
    "GmrError",
    "configure",
    "empty_cache",
    "library_path",
    "policy",
    "snapshot",
    "stats",
    "summary",
    "use_in_cupy",
    "use_in_torch",
]

_lock = threading.Lock()
_lib = None
_path = None
_frozen = False  # a runtime may exist: GMR_CONFIG can no longer change


def _library():
    global _lib, _path
    with _lock:
        if _lib is None:
            _lib, _path = load()
        return _lib


def library_path():
    """The path (or soname) libgmr was loaded from."""
    _library()
    return _path


def _check(rc, what, rt=None):
    if rc != 0:
        lib = _library()
        text = (lib.gmr_last_error(rt) if rt else lib.gmr_thread_last_error()).decode(
            errors="replace")
        raise GmrError(rc, "%s: %s%s" % (what, lib.gmr_strerror(rc).decode(),
                                         (": " + text) if text else ""))


def configure(config=None):
    """Make `config` (a YAML file) the configuration of gmr's process-wide
    runtimes, after checking that it loads.  None keeps GMR_CONFIG as it is
    (unset: PyTorch-style caching).  Returns the path in force, or None.

    Raises ValueError (with file:line:column) for a bad file, RuntimeError
    when a runtime already exists under another configuration."""
    global _frozen
    lib = _library()
    if config is None:
        return os.environ.get("GMR_CONFIG") or None
    # str, bytes or path-like; the environment holds it as text
    path = os.fsdecode(os.path.abspath(os.fspath(config)))
    cfg = ctypes.c_void_p()
    err = _Error()
    rc = lib.gmr_config_load_file(os.fsencode(path), ctypes.byref(cfg), ctypes.byref(err))
    if rc != 0:
        raise ValueError("gmr: %s" % err.message.decode(errors="replace"))
    lib.gmr_config_free(cfg)
    with _lock:
        current = os.environ.get("GMR_CONFIG") or None
        if _frozen and current != path:
            raise RuntimeError(
                "gmr: the runtime already exists with GMR_CONFIG=%s; configure gmr "
                "before the first allocation" % current)
        os.environ["GMR_CONFIG"] = path
    return path


def _runtime(device):
    global _frozen
    lib = _library()
    # a C int: 2**32 would silently be device 0
    if isinstance(device, bool) or not isinstance(device, int) or not 0 <= device < 2**31:
        raise ValueError("gmr: device must be a CUDA ordinal (an int in [0, 2**31)), not %r"
                         % (device,))
    rt = ctypes.c_void_p()
    rc = lib.gmr_default_runtime(device, ctypes.byref(rt))
    if rc != 0:  # no runtime was built: configure() may still choose another file
        raise GmrError(rc, "gmr: no runtime for device %d: %s" % (
            device, lib.gmr_hooks_last_error().decode(errors="replace")))
    _frozen = True
    return rt


def _fnptr(name):
    return ctypes.cast(getattr(_library(), name), ctypes.c_void_p).value


def use_in_torch(config=None):
    """Make PyTorch allocate CUDA memory through gmr
    (torch.cuda.memory.CUDAPluggableAllocator).  Call it before the first CUDA
    tensor.  torch.cuda.empty_cache() and Tensor.record_stream() reach gmr;
    an allocation past the memory gmr may use raises torch.OutOfMemoryError.
    torch.cuda.memory_stats() does not work under a pluggable allocator: use
    gmr.stats() and gmr.summary()."""
    global _frozen
    try:
        import torch
    except ImportError as e:
        raise ImportError("gmr.use_in_torch needs PyTorch: %s" % e) from e
    configure(config)
    alloc = torch.cuda.memory.CUDAPluggableAllocator(_path, "gmr_torch_alloc", "gmr_torch_free")
    native = alloc.allocator()
    for setter, fn in (("set_reset_fn", "gmr_torch_empty_cache"),
                       ("set_record_stream_fn", "gmr_torch_record_stream")):
        if hasattr(native, setter):
            getattr(native, setter)(_fnptr(fn))
    torch.cuda.memory.change_current_allocator(alloc)
    _frozen = True
    return alloc


def use_in_cupy(config=None):
    """Make CuPy allocate device memory through gmr (cupy.cuda.set_allocator
    with a CFunctionAllocator: one C call per allocation).  A refused
    allocation raises cupy.cuda.memory.OutOfMemoryError with gmr's message.
    CuPy gives no stream to its allocator: blocks belong to the default
    stream."""
    global _frozen
    try:
        import cupy
        from cupy.cuda import memory as cmem
    except ImportError as e:
        raise ImportError("gmr.use_in_cupy needs CuPy: %s" % e) from e
    configure(config)
    lib = _library()
    calloc = cmem.CFunctionAllocator(0, _fnptr("gmr_cupy_malloc"), _fnptr("gmr_cupy_free"), lib)

    def malloc(size):
        mem = calloc.malloc(size)
        if size and not mem.ptr:
            why = lib.gmr_hooks_last_error().decode(errors="replace")
            rt = _runtime(cupy.cuda.runtime.getDevice())
            reserved, limit = ctypes.c_int64(-1), ctypes.c_int64(0)
            lib.gmr_stat_get(rt, b"reserved_bytes", ctypes.byref(reserved))
            lib.gmr_stat_get(rt, b"limit_bytes", ctypes.byref(limit))
            raise cmem.OutOfMemoryError(size, reserved.value, limit.value) from GmrError(
                -1, "gmr: " + why)
        return mem

    cupy.cuda.set_allocator(malloc)
    _frozen = True
    return malloc


def stats(device=0):
    """The statistics of `device` as a dict: the figures every policy keeps
    (gmr_stats_t: "reserved_bytes", "allocated_bytes", "num_allocs",
    "limit_bytes"...), then the policy's own named statistics (PyTorch's keys,
    e.g. "allocated_bytes.all.current", under the caching policy; TensorFlow's
    under BFC; "limit_in_use_bytes"... under a limit)."""
    lib = _library()
    rt = _runtime(device)
    st = Stats()
    _check(lib.gmr_stats(rt, ctypes.byref(st)), "gmr_stats", rt)
    out = {name: getattr(st, name) for name, _ in Stats._fields_}

    def cb(key, value, ud):
        out[key.decode()] = value
        return 0

    c_cb = STAT_CB(cb)
    _check(lib.gmr_stats_foreach(rt, c_cb, None), "gmr_stats_foreach", rt)
    return out


def policy(device=0):
    """The policy stack of the device's runtime, e.g. "limit(caching)"."""
    return _library().gmr_runtime_policy(_runtime(device)).decode()


def empty_cache(device=0):
    """Return the device's cached, wholly free memory (gmr_empty_cache)."""
    rt = _runtime(device)
    _check(_library().gmr_empty_cache(rt), "gmr_empty_cache", rt)


def _write_with(fn, rt, path, what):
    c = libc()
    f = c.fopen(os.fsencode(path), b"wb")
    if not f:
        e = ctypes.get_errno()
        raise OSError(e, "gmr: cannot open %s for writing: %s" % (os.fsdecode(path),
                                                                  os.strerror(e)), path)
    try:
        rc = fn(rt, f)
    finally:
        c.fclose(f)
    _check(rc, what, rt)


def summary(device=0):
    """The policy's summary as text (torch.cuda.memory_summary()'s layout under
    the caching policy)."""
    lib = _library()
    rt = _runtime(device)
    with tempfile.TemporaryDirectory(prefix="gmr-") as d:
        p = os.path.join(d, "summary.txt")
        _write_with(lib.gmr_summary, rt, p, "gmr_summary")
        with open(p, encoding="utf-8", errors="replace") as fh:
            return fh.read()


def snapshot(path, device=0):
    """Write the device's memory snapshot to `path` as PyTorch's snapshot
    pickle (what torch.cuda.memory._dump_snapshot writes; open it at
    https://pytorch.org/memory_viz).  Needs a libgmr with gmr_snapshot_write."""
    lib = _library()
    if not hasattr(lib, "gmr_snapshot_write"):
        raise NotImplementedError(
            "gmr.snapshot: this libgmr (%s) has no gmr_snapshot_write" % _path)
    _write_with(lib.gmr_snapshot_write, _runtime(device), path, "gmr_snapshot_write")
