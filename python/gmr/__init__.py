"""gmr from Python: PyTorch and CuPy allocate through gmr, gmr reports, and
traces replay under several policies side by side.

    import gmr
    gmr.compare("traces/gpt2_train.csv", ["pytorch", "tf-growth"])  # as gmr-compare --json
    gmr.use_in_torch("config/pytorch.yaml")   # before the first CUDA tensor
    gmr.use_in_cupy()                         # same runtime, same pool
    ...
    gmr.stats(0)["allocated_bytes.all.current"]
    print(gmr.summary(0))
    gmr.snapshot("snap.pickle")               # torch.cuda.memory._snapshot() format
    with gmr.region("weights"):               # tensors made here are tagged
        model = build_model()
    gmr.sleep("weights", mode="offload")      # device memory given back, addresses kept
    gmr.wake("weights")                       # mapped again, contents copied back

Every framework in the process allocates from gmr's process-wide runtime of
the device (gmr_default_runtime), built from the YAML file named by
GMR_CONFIG.  `config` arguments set GMR_CONFIG; they must come before the
first allocation, since a runtime is built once (a runtime that could not be
built is not: configure() may then name another file and the next call
retries).  Programs that allocate with cudaMalloc/cuMemAlloc need no call:
LD_PRELOAD=libgmr-preload.so routes them (docs/frameworks.md says which
frameworks that covers).

Only ctypes: nothing is compiled beyond libgmr itself, which the wheel
(distribution gmr-runtime) carries; library() says which libgmr was loaded
and why (_lib.py has the search order).  Paths may be str, bytes or
os.PathLike; bad arguments raise TypeError or ValueError with a sentence.
"""

import ctypes as _ctypes
import os as _os
import tempfile as _tempfile
import threading as _threading

from . import _lib, _replay
from ._lib import GmrError

__version__ = "0.1.0"  # = gmr_version() of the libgmr it loads (checked at load)

DEFAULT_CAPACITY = _replay.DEFAULT_CAPACITY

__all__ = [
    "DEFAULT_CAPACITY",
    "GmrError",
    "__version__",
    "compare",
    "configure",
    "empty_cache",
    "library",
    "library_path",
    "policy",
    "region",
    "sleep",
    "snapshot",
    "snapshot_to_csv",
    "stats",
    "summary",
    "tag_info",
    "use_in_cupy",
    "use_in_torch",
    "wake",
]

_lock = _threading.Lock()
_loaded = None
_frozen = False  # a runtime exists: GMR_CONFIG can no longer change
_INT_MAX = (1 << 31) - 1


def _library():
    """The ctypes.CDLL of libgmr, loaded on first use."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = _lib.load(__version__)
        return _loaded.cdll


def library():
    """The libgmr in use: .path (the file), .origin ("GMR_LIBRARY",
    "already loaded", "bundled" or "system": why this one) and .version.
    Loads it on first use; raises OSError naming every place tried."""
    _library()
    return _loaded


def library_path():
    """The file libgmr was loaded from."""
    return library().path


def _check(rc, what, rt=None):
    if rc != 0:
        lib = _library()
        text = (lib.gmr_last_error(rt) if rt else lib.gmr_thread_last_error()).decode(
            errors="replace")
        raise GmrError(rc, "%s: %s%s" % (what, lib.gmr_strerror(rc).decode(),
                                         (": " + text) if text else ""))


def compare(trace, configs, capacity=DEFAULT_CAPACITY, check=False):
    """Replay the trace file `trace` (gmr's CSV, an RMM log or a PyTorch memory
    snapshot pickle, as gmr-compare reads them) under each configuration of `configs` (a
    path or a name such as "pytorch", or a list of them), each on a fresh
    simulated device of `capacity` bytes (an int, or a size such as
    "80GiB"; default 143771 MiB, an H200), as gmr-compare does.

    Returns a list with one dict per configuration, with the keys and values
    of `gmr-compare --json` ("config", "status", "peak_reserved",
    "fragmentation_at_peak", "first_oom", "top_sites"...).  A configuration that does not
    load or run has status "load_error" or "runtime_error" and an "error";
    an OOM is a result.  check=True walks the policy's invariants after
    every event.  Names are looked up in ./config, the configurations
    bundled with the package, then the installed ones; an unknown name, a
    bad capacity or trace raises ValueError (a missing trace OSError)
    before anything is replayed."""
    return _replay.compare(_library(), trace, configs, capacity=capacity, check=check)


def configure(config=None):
    """Make `config` (a YAML file: str, bytes or os.PathLike; or the name of
    a ready configuration, e.g. "pytorch", looked up as compare() does) the
    configuration of gmr's process-wide runtimes, after checking that it
    loads.  None keeps GMR_CONFIG as it is (unset: PyTorch-style caching).
    Returns the path in force, or None.

    Raises ValueError (with file:line:column) for a bad file, RuntimeError
    when a runtime already exists under another configuration."""
    lib = _library()
    if config is None:
        return _os.environ.get("GMR_CONFIG") or None
    raw = _replay.find_config(lib, config)  # a file, or a name such as "pytorch"
    path = _os.fsdecode(_os.path.abspath(raw))
    cfg = _ctypes.c_void_p()
    err = _lib.Error()
    rc = lib.gmr_config_load_file(_os.fsencode(path), _ctypes.byref(cfg), _ctypes.byref(err))
    if rc != 0:
        raise ValueError("gmr: %s" % (err.message.decode(errors="replace")
                                      or "%s: %s" % (path, lib.gmr_strerror(rc).decode())))
    lib.gmr_config_free(cfg)
    with _lock:
        current = _os.environ.get("GMR_CONFIG") or None
        if _frozen and current != path:
            raise RuntimeError(
                "gmr: the runtime already exists with GMR_CONFIG=%s; configure gmr "
                "before the first allocation" % current)
        _os.environ["GMR_CONFIG"] = path
    return path


def _device(device):
    if isinstance(device, bool) or not isinstance(device, int):
        raise TypeError("gmr: device must be a CUDA ordinal (an int), not %s"
                        % type(device).__name__)
    if device < 0 or device > _INT_MAX:
        raise ValueError("gmr: device must be a CUDA ordinal in [0, %d], not %d"
                         % (_INT_MAX, device))
    return device


def _runtime(device):
    global _frozen
    lib = _library()
    device = _device(device)
    rt = _ctypes.c_void_p()
    rc = lib.gmr_default_runtime(device, _ctypes.byref(rt))
    if rc != 0:
        raise GmrError(rc, "gmr: no runtime for device %d: %s" % (
            device, (lib.gmr_hooks_last_error() or lib.gmr_thread_last_error()).decode(
                errors="replace") or lib.gmr_strerror(rc).decode()))
    _frozen = True  # only once one exists: a failed creation may be retried
    return rt


def _fnptr(name):
    return _ctypes.cast(getattr(_library(), name), _ctypes.c_void_p).value


_torch_fallback_warned = False


def use_in_torch(config=None, adapter=None):
    """Make PyTorch allocate CUDA memory through gmr.  Call it before the
    first CUDA tensor.

    adapter "native" (the default; or the environment's GMR_TORCH_ADAPTER)
    installs gmr's own CUDAAllocator (csrc/gmr_torch.cpp, compiled against
    the imported torch on first use and cached: python3 -m gmr build-torch
    builds it ahead), under which torch.cuda's whole memory API works:
    memory_stats(), memory_summary(), _record_memory_history() and
    _snapshot(), CUDA graphs, torch.cuda.MemPool, torch.compile's
    reduce-overhead mode, set_per_process_memory_fraction, IPC.  When the
    default cannot be built (no compiler or headers), a warning says why
    and the "pluggable" path is used: CUDAPluggableAllocator over libgmr's
    hooks, where torch.cuda.empty_cache() and Tensor.record_stream() reach
    gmr but torch.cuda.memory_stats() and the rest raise (use gmr.stats()
    and gmr.summary()).  An adapter named explicitly raises on failure.
    Under either, an allocation past the memory gmr may use raises
    torch.OutOfMemoryError with gmr's message.  Returns "native", or the
    CUDAPluggableAllocator."""
    global _frozen, _torch_fallback_warned
    try:
        import torch
    except ImportError as e:
        raise ImportError("gmr.use_in_torch needs PyTorch: %s" % e) from e
    chosen = adapter if adapter is not None else (_os.environ.get("GMR_TORCH_ADAPTER") or None)
    if chosen not in (None, "native", "pluggable"):
        raise ValueError('gmr: adapter must be "native" or "pluggable", not %r' % (chosen,))
    configure(config)
    if chosen in (None, "native"):
        from . import _torch
        try:
            _torch.install(library_path())
            _frozen = True
            return "native"
        except _torch.BuildError as e:
            if chosen == "native":
                raise
            if not _torch_fallback_warned:
                _torch_fallback_warned = True
                import warnings
                warnings.warn("%s\ngmr: falling back to the pluggable adapter "
                              "(torch.cuda.memory_stats() and CUDA graphs do not work "
                              "under it)" % e, RuntimeWarning, stacklevel=2)
    alloc = torch.cuda.memory.CUDAPluggableAllocator(library_path(), "gmr_torch_alloc",
                                                      "gmr_torch_free")
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
            reserved, limit = _ctypes.c_int64(-1), _ctypes.c_int64(0)
            lib.gmr_stat_get(rt, b"reserved_bytes", _ctypes.byref(reserved))
            lib.gmr_stat_get(rt, b"limit_bytes", _ctypes.byref(limit))
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
    st = _lib.Stats()
    _check(lib.gmr_stats(rt, _ctypes.byref(st)), "gmr_stats", rt)
    out = {name: getattr(st, name) for name in _lib.STATS_FIELDS}

    def cb(key, value, ud):
        out[key.decode()] = value
        return 0

    c_cb = _lib.STAT_CB(cb)
    _check(lib.gmr_stats_foreach(rt, c_cb, None), "gmr_stats_foreach", rt)
    return out


def policy(device=0):
    """The policy stack of the device's runtime, e.g. "limit(caching)"."""
    return _library().gmr_runtime_policy(_runtime(device)).decode()


def empty_cache(device=0):
    """Return the device's cached, wholly free memory (gmr_empty_cache)."""
    rt = _runtime(device)
    _check(_library().gmr_empty_cache(rt), "gmr_empty_cache", rt)


def _tag(tag):
    if isinstance(tag, str):
        tag = tag.encode()
    if not isinstance(tag, bytes):
        raise TypeError("gmr: a tag is a str, not %s" % type(tag).__name__)
    if not 1 <= len(tag) <= 63 or b"\0" in tag:
        raise ValueError("gmr: a tag has 1 to 63 bytes and no NUL, not %r" % tag)
    return tag


_STREAM_ANY = _ctypes.c_void_p(_ctypes.c_size_t(-1).value)  # GMR_STREAM_ANY


class region:
    """``with gmr.region("weights"): ...``: every allocation this thread makes
    on the device's runtime inside the block (PyTorch tensors through the
    native adapter, CuPy arrays, the interposer's cudaMalloc) goes to the
    tag's own pool, which gmr.sleep and gmr.wake act on (docs/sleep-wake.md).
    Regions nest; the innermost wins.

    all_threads=True routes every thread's allocations on every stream to
    the tag instead (gmr_tag_pool + gmr_pool_begin(pool, GMR_STREAM_ANY)):
    for frameworks that allocate on threads of their own, such as XLA
    (JAX with XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async under the interposer).
    It is a stream route, as a CUDA graph capture's is: the latest begun
    wins, and a route wins over a thread's region."""

    def __init__(self, tag, device=0, all_threads=False):
        self._tag = _tag(tag)
        self._device = _device(device)
        self._all = bool(all_threads)
        self._rt = self._pool = None

    def __enter__(self):
        rt = _runtime(self._device)
        lib = _library()
        if self._all:
            pool = _ctypes.c_void_p()
            _check(lib.gmr_tag_pool(rt, self._tag, _ctypes.byref(pool)), "gmr_tag_pool", rt)
            _check(lib.gmr_pool_begin(pool, _STREAM_ANY), "gmr_pool_begin", rt)
            self._pool = pool
        else:
            _check(lib.gmr_region_begin(rt, self._tag), "gmr_region_begin", rt)
        self._rt = rt
        return self

    def __exit__(self, *exc):
        rt, self._rt = self._rt, None
        if self._pool is not None:
            pool, self._pool = self._pool, None
            _check(_library().gmr_pool_end(pool, _STREAM_ANY), "gmr_pool_end", rt)
        else:
            _check(_library().gmr_region_end(rt), "gmr_region_end", rt)
        return False


_SLEEP_MODES = {"offload": 1, "discard": 2}


def sleep(tag, mode="offload", device=0, keep_host=False):
    """Give the device memory of `tag` back, keeping its addresses: "offload"
    copies its contents to pinned host memory first, "discard" does not.
    keep_host=True (with "offload") keeps that pinned buffer after the wake
    for the next sleep, which then copies without pinning memory again: host
    memory held while awake, shown as tag_info's "host_kept_bytes".
    Sleeping an asleep tag does nothing."""
    if mode not in _SLEEP_MODES:
        raise ValueError("gmr.sleep: mode %r: expected 'offload' or 'discard'" % (mode,))
    if keep_host and mode != "offload":
        raise ValueError("gmr.sleep: keep_host=True needs mode='offload'")
    rt = _runtime(device)
    flags = _SLEEP_MODES[mode] | (_lib.SLEEP_KEEP_HOST if keep_host else 0)
    _check(_library().gmr_sleep(rt, _tag(tag), flags), "gmr_sleep", rt)


def wake(tag, device=0):
    """Map new device memory at the addresses of `tag` and copy its offloaded
    contents back; raises GmrError (nothing changed) when the memory is not
    there.  Waking an awake tag does nothing."""
    rt = _runtime(device)
    _check(_library().gmr_wake(rt, _tag(tag)), "gmr_wake", rt)


def tag_info(tag, device=0):
    """A tag's state as a dict: "asleep", "mode", "mapped_bytes",
    "sleeping_bytes", "offloaded_bytes", "sleeps", "wakes", "pool_id",
    "host_kept_bytes"."""
    rt = _runtime(device)
    t = _lib.TagInfo()
    _check(_library().gmr_tag_info(rt, _tag(tag), _ctypes.byref(t)), "gmr_tag_info", rt)
    out = {name: getattr(t, name) for name, _ in _lib.TagInfo._fields_ if name != "tag"}
    out["asleep"] = bool(out["asleep"])
    out["mode"] = {0: None, 1: "offload", 2: "discard"}[out["mode"]]
    return out


def _write_with(fn, rt, path, what):
    c = _lib.libc()
    raw = _replay.fspath_bytes(path, "path")
    f = c.fopen(raw, b"wb")
    if not f:
        err = _ctypes.get_errno()
        raise OSError(err, "gmr: cannot open %s for writing: %s"
                      % (_os.fsdecode(raw), _os.strerror(err)))
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
    with _tempfile.TemporaryDirectory(prefix="gmr-") as d:
        p = _os.path.join(d, "summary.txt")
        _write_with(lib.gmr_summary, rt, p, "gmr_summary")
        with open(p, encoding="utf-8", errors="replace") as fh:
            return fh.read()


def snapshot(path, device=0):
    """Write the device's memory snapshot to `path` as PyTorch's snapshot
    pickle (what torch.cuda.memory._dump_snapshot writes; open it at
    https://pytorch.org/memory_viz).  Needs a libgmr with gmr_snapshot_write."""
    _write_with(_library().gmr_snapshot_write, _runtime(device), path, "gmr_snapshot_write")


def snapshot_to_csv(data, name="snapshot", device=None, reconstruct=False, sites=False):
    """A PyTorch memory snapshot (the pickle's bytes; `name` in messages) as
    the trace CSV tools/snapshot2csv.py writes: returns (csv, warnings,
    counts), counts a dict of device, allocations, frees, live_at_end,
    unknown_frees, reconstructed and peak_requested.  The pickle is read by
    libgmr, strictly: nothing in it runs.  ValueError with a sentence when it
    is not a usable snapshot."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("gmr: snapshot_to_csv takes the snapshot's bytes, not %s"
                        % type(data).__name__)
    return _replay.snapshot_csv(_library(), data, name, device, reconstruct, sites)
