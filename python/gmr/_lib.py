"""Finding and describing libgmr for ctypes.

The library is looked up, in order:
  1. the file named by the environment variable GMR_LIBRARY;
  2. a libgmr.so already loaded in the process (LD_PRELOAD=libgmr-preload.so
     loads it), so that the hooks, the interposer and this package share one
     runtime per device, hence one pool;
  3. libgmr.so next to this package (a wheel or a copy may put it there);
  4. the system's search path (ldconfig, LD_LIBRARY_PATH).
"""

import ctypes
import ctypes.util
import os

_SONAME = "libgmr.so.0"


class GmrError(RuntimeError):
    """A gmr call failed; `code` is the negative GMR_E* value."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class _Error(ctypes.Structure):  # gmr_error_t
    _fields_ = [
        ("code", ctypes.c_int),
        ("line", ctypes.c_int),
        ("column", ctypes.c_int),
        ("file", ctypes.c_char * 256),
        ("message", ctypes.c_char * 1024),
    ]


_STATS_FIELDS = (
    "reserved_bytes", "peak_reserved_bytes", "allocated_bytes", "peak_allocated_bytes",
    "requested_bytes", "peak_requested_bytes", "active_bytes", "peak_active_bytes",
    "segments", "peak_segments", "allocations", "peak_allocations", "num_allocs",
    "num_frees", "device_allocs", "device_frees", "ooms", "alloc_retries",
    "largest_free_block", "free_cached_bytes", "limit_bytes",
)


class Stats(ctypes.Structure):  # gmr_stats_t: every field uint64_t, in this order
    _fields_ = [(name, ctypes.c_uint64) for name in _STATS_FIELDS]


STAT_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_int64, ctypes.c_void_p)


def _candidates():
    env = os.environ.get("GMR_LIBRARY")
    if env:
        return [("GMR_LIBRARY", env)]
    out = []
    try:  # already in the process?
        ctypes.CDLL(_SONAME, mode=os.RTLD_NOLOAD | ctypes.RTLD_GLOBAL)
        out.append(("loaded", _SONAME))
    except OSError:
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("libgmr.so", _SONAME):
        path = os.path.join(here, name)
        if os.path.exists(path):
            out.append(("package", path))
    found = ctypes.util.find_library("gmr")
    out.append(("system", found or _SONAME))
    return out


def _declare(lib):
    vp, i, sz, cp = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_char_p
    sig = {
        "gmr_strerror": (cp, [i]),
        "gmr_config_load_file": (i, [cp, ctypes.POINTER(vp), ctypes.POINTER(_Error)]),
        "gmr_config_free": (None, [vp]),
        "gmr_config_policy_name": (cp, [vp]),
        "gmr_default_runtime": (i, [i, ctypes.POINTER(vp)]),
        "gmr_stats": (i, [vp, ctypes.POINTER(Stats)]),
        "gmr_stats_foreach": (i, [vp, STAT_CB, vp]),
        "gmr_stat_get": (i, [vp, cp, ctypes.POINTER(ctypes.c_int64)]),
        "gmr_summary": (i, [vp, vp]),
        "gmr_last_error": (cp, [vp]),
        "gmr_thread_last_error": (cp, []),
        "gmr_runtime_policy": (cp, [vp]),
        "gmr_runtime_backend": (cp, [vp]),
        "gmr_empty_cache": (i, [vp]),
        "gmr_stats_reset_peak": (None, [vp]),
        "gmr_stats_reset_accumulated": (None, [vp]),
        "gmr_mem_info": (i, [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)]),
        "gmr_torch_alloc": (vp, [ctypes.c_ssize_t, i, vp]),
        "gmr_torch_free": (None, [vp, ctypes.c_ssize_t, i, vp]),
        "gmr_torch_empty_cache": (None, []),
        "gmr_torch_record_stream": (None, [vp, vp]),
        "gmr_cupy_malloc": (vp, [vp, sz, i]),
        "gmr_cupy_free": (None, [vp, vp, i]),
        "gmr_hooks_last_error": (cp, []),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    if hasattr(lib, "gmr_snapshot_write"):
        lib.gmr_snapshot_write.restype = i
        lib.gmr_snapshot_write.argtypes = [vp, vp]


def load():
    """Return (ctypes.CDLL, path) for libgmr, or raise OSError naming every
    place that was tried."""
    tried = []
    for where, path in _candidates():
        try:
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            tried.append("%s (%s): %s" % (path, where, e))
            continue
        try:
            _declare(lib)
        except AttributeError as e:
            tried.append("%s (%s): not a libgmr with framework hooks (%s)" % (path, where, e))
            continue
        return lib, path
    raise OSError(
        "gmr: libgmr.so could not be loaded; set GMR_LIBRARY to its path. Tried: "
        + "; ".join(tried)
    )


_libc = None


def libc():
    """The C library, for fopen/fclose (gmr_summary and gmr_snapshot_write
    write to a FILE *)."""
    global _libc
    if _libc is None:
        c = ctypes.CDLL(None, use_errno=True)  # so that ctypes.get_errno() sees fopen's
        c.fopen.restype = ctypes.c_void_p
        c.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        c.fclose.restype = ctypes.c_int
        c.fclose.argtypes = [ctypes.c_void_p]
        _libc = c
    return _libc
