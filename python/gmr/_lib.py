"""Finding, checking and describing libgmr for ctypes.

The library is looked up, in order, and the first one that loads, has the
entry points this package calls and has this package's version is used:
  1. the file named by the environment variable GMR_LIBRARY (an explicit
     choice, e.g. a build tree's lib/.libs/libgmr.so);
  2. a libgmr.so.0 already loaded in the process (LD_PRELOAD=libgmr-preload.so
     loads one), so that the hooks, the interposer and this package share one
     runtime per device, hence one pool;
  3. the libgmr.so.0 bundled in this package (the wheel carries it);
  4. the system's (ldconfig, LD_LIBRARY_PATH: the Debian package libgmr0).
library() returns a Library naming the file and why it was chosen; a
failure names every place tried and why each was refused.
"""

import ctypes
import ctypes.util
import os

_SONAME = "libgmr.so.0"
HERE = os.path.dirname(os.path.abspath(__file__))


class GmrError(RuntimeError):
    """A gmr call failed; `code` is the negative GMR_E* value."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class Error(ctypes.Structure):  # gmr_error_t
    _fields_ = [
        ("code", ctypes.c_int),
        ("line", ctypes.c_int),
        ("column", ctypes.c_int),
        ("file", ctypes.c_char * 256),
        ("message", ctypes.c_char * 1024),
    ]


STATS_FIELDS = (
    "reserved_bytes", "peak_reserved_bytes", "allocated_bytes", "peak_allocated_bytes",
    "requested_bytes", "peak_requested_bytes", "active_bytes", "peak_active_bytes",
    "segments", "peak_segments", "allocations", "peak_allocations", "num_allocs",
    "num_frees", "device_allocs", "device_frees", "ooms", "alloc_retries",
    "largest_free_block", "free_cached_bytes", "limit_bytes",
)


class Stats(ctypes.Structure):  # gmr_stats_t: every field uint64_t, in this order
    _fields_ = [(name, ctypes.c_uint64) for name in STATS_FIELDS]


STAT_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_int64, ctypes.c_void_p)


SLEEP_KEEP_HOST = 4  # GMR_SLEEP_KEEP_HOST


class TagInfo(ctypes.Structure):  # gmr_tag_info_t
    _fields_ = [("tag", ctypes.c_char * 64), ("pool_id", ctypes.c_uint64),
                ("asleep", ctypes.c_int), ("mode", ctypes.c_int),
                ("mapped_bytes", ctypes.c_uint64), ("sleeping_bytes", ctypes.c_uint64),
                ("offloaded_bytes", ctypes.c_uint64), ("sleeps", ctypes.c_uint64),
                ("wakes", ctypes.c_uint64), ("host_kept_bytes", ctypes.c_uint64)]


class Library:
    """The loaded libgmr: `cdll` (ctypes.CDLL), `path`, `origin` (one of
    "GMR_LIBRARY", "already loaded", "bundled", "system") and `version`."""

    def __init__(self, cdll, path, origin, version):
        self.cdll, self.path, self.origin, self.version = cdll, path, origin, version

    def __repr__(self):
        return "<libgmr %s from %s (%s)>" % (self.version, self.path, self.origin)


def _loaded_path(name):
    """The file a loaded shared object came from (/proc/self/maps), or name."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                parts = line.split(None, 5)
                if len(parts) == 6 and os.path.basename(parts[5].strip()).startswith(name):
                    return parts[5].strip()
    except OSError:
        pass
    return name


def _candidates():
    env = os.environ.get("GMR_LIBRARY")
    if env:
        return [("GMR_LIBRARY", env)]
    out = []
    try:  # already in the process?
        ctypes.CDLL(_SONAME, mode=os.RTLD_NOLOAD | ctypes.RTLD_GLOBAL)
        out.append(("already loaded", _loaded_path(_SONAME)))
    except OSError:
        pass
    bundled = os.path.join(HERE, _SONAME)
    if os.path.exists(bundled):
        out.append(("bundled", bundled))
    found = ctypes.util.find_library("gmr")
    out.append(("system", found or _SONAME))
    return out


def _declare(lib):
    vp, i, sz, cp = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_char_p
    sig = {
        "gmr_version": (cp, []),
        "gmr_strerror": (cp, [i]),
        "gmr_config_load_file": (i, [cp, ctypes.POINTER(vp), ctypes.POINTER(Error)]),
        "gmr_config_free": (None, [vp]),
        "gmr_config_policy_name": (cp, [vp]),
        "gmr_config_find": (i, [cp, cp, sz]),
        "gmr_config_dir": (cp, []),
        "gmr_parse_size": (i, [cp, ctypes.POINTER(ctypes.c_uint64)]),
        "gmr_default_runtime": (i, [i, ctypes.POINTER(vp)]),
        "gmr_runtime_free": (None, [vp]),
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
        "gmr_snapshot_write": (i, [vp, vp]),
        "gmr_torch_alloc": (vp, [ctypes.c_ssize_t, i, vp]),
        "gmr_torch_free": (None, [vp, ctypes.c_ssize_t, i, vp]),
        "gmr_torch_empty_cache": (None, []),
        "gmr_torch_record_stream": (None, [vp, vp]),
        "gmr_cupy_malloc": (vp, [vp, sz, i]),
        "gmr_cupy_free": (None, [vp, vp, i]),
        "gmr_hooks_last_error": (cp, []),
        "gmr_region_begin": (i, [vp, cp]),
        "gmr_region_end": (i, [vp]),
        "gmr_region_current": (cp, [vp]),
        "gmr_sleep": (i, [vp, cp, i]),
        "gmr_wake": (i, [vp, cp]),
        "gmr_tag_info": (i, [vp, cp, ctypes.POINTER(TagInfo)]),
        "gmr_tag_pool": (i, [vp, cp, ctypes.POINTER(vp)]),
        "gmr_pool_begin": (i, [vp, vp]),
        "gmr_pool_end": (i, [vp, vp]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    from . import _replay  # the replay API's structures and signatures

    _replay.declare(lib)


def _bundled_yaml():
    """The wheel carries libyaml-0.so.2 (the manylinux policy does not allow
    it from the system): load that copy first, by its path, so that the
    bundled libgmr uses it wherever the loader would look (LD_LIBRARY_PATH
    comes before RUNPATH $ORIGIN)."""
    path = os.path.join(HERE, "libyaml-0.so.2")
    if os.path.exists(path):
        ctypes.CDLL(path)


def load(want_version):
    """Return a Library for libgmr `want_version`, or raise OSError naming
    every place that was tried."""
    tried = []
    for origin, path in _candidates():
        if origin == "bundled":
            try:
                _bundled_yaml()
            except OSError as e:
                tried.append("%s (%s): its libyaml: %s" % (path, origin, e))
                continue
        try:
            cdll = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            tried.append("%s (%s): %s" % (path, origin, e))
            continue
        try:
            _declare(cdll)
        except AttributeError as e:
            tried.append("%s (%s): not a libgmr %s (%s)" % (path, origin, want_version, e))
            continue
        version = cdll.gmr_version().decode()
        if version != want_version:
            tried.append("%s (%s): libgmr %s, this package needs %s" % (
                path, origin, version, want_version))
            continue
        if origin == "system" and not os.path.isabs(path):
            path = _loaded_path(_SONAME)
        return Library(cdll, path, origin, version)
    raise OSError(
        "gmr: no usable libgmr %s (install the wheel with its bundled library, the "
        "Debian package libgmr0, or set GMR_LIBRARY to the file). Tried: %s"
        % (want_version, "; ".join(tried)))


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
