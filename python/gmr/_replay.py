"""The replay API of gmr_replay.h in ctypes, and gmr.compare over it.

compare() does what gmr-compare does for each configuration (tools/compare.c,
docs/compare.md), through the public replay API only:
  1. a timed replay on a fresh simulated device of `capacity` bytes: the
     figures, the replay time, the final statistics;
  2. a second replay on a fresh device that finds the peak event: reserved
     bytes at their maximum (peak_reserved) and, among the events where they
     are there, the one with the most bytes allocated;
  3. at that event: free = free_cached_bytes, largest = min(largest free
     block, free), fragmentation = 1 - largest / free (0 when free = 0),
     rounding loss = allocated - requested;
  4. the driver calls of the timed replay (gmr_sim_counters, gmr_sim_call_bytes)
     and their device time, from the cost model copied from tools/compare-cost.c.
Each result is a dict with the keys of `gmr-compare --json`, the same values
(fractions rounded to 4 places as the JSON prints them; seconds and
events_per_second are this run's).
"""

import ctypes
import os

from ._lib import GmrError, Stats

MiB = 1 << 20
TOP_SITES = 5  # call sites listed at the peak, as gmr-compare lists them
ALLOC, FREE = 0, 1  # gmr_trace_action_t
# GMR_SIM_DEFAULT_CAPACITY of include/gmr.h (ctypes cannot read a #define): an
# H200 as CUDA reports it, the tools' default too.
DEFAULT_CAPACITY = 143771 * MiB


class TraceEvent(ctypes.Structure):  # gmr_trace_event_t
    _fields_ = [("time_us", ctypes.c_uint64), ("size", ctypes.c_uint64),
                ("stream", ctypes.c_uint64), ("id", ctypes.c_uint32), ("line", ctypes.c_uint32),
                ("action", ctypes.c_uint8), ("thread", ctypes.c_uint8),
                ("site", ctypes.c_uint32)]


class TraceData(ctypes.Structure):  # gmr_trace_data_t
    _fields_ = [("events", ctypes.POINTER(TraceEvent)), ("n_events", ctypes.c_size_t),
                ("n_ids", ctypes.c_size_t), ("n_live_at_end", ctypes.c_size_t),
                ("n_streams", ctypes.c_size_t), ("peak_requested", ctypes.c_uint64),
                ("source", ctypes.c_char_p), ("sites", ctypes.POINTER(ctypes.c_char_p)),
                ("n_sites", ctypes.c_size_t), ("n_alloc_failures", ctypes.c_size_t),
                ("alloc_failure_bytes", ctypes.c_uint64),
                ("first_alloc_failure_line", ctypes.c_uint32), ("format", ctypes.c_int),
                ("note", ctypes.c_char_p)]


class SnapshotCsvOptions(ctypes.Structure):  # gmr_snapshot_csv_options_t
    _fields_ = [("has_device", ctypes.c_int), ("device", ctypes.c_int),
                ("reconstruct", ctypes.c_int), ("sites", ctypes.c_int)]


class SnapshotCsv(ctypes.Structure):  # gmr_snapshot_csv_t
    _fields_ = [("csv", ctypes.c_void_p), ("csv_len", ctypes.c_size_t),
                ("warnings", ctypes.c_char_p), ("device", ctypes.c_int),
                ("allocations", ctypes.c_size_t), ("frees", ctypes.c_size_t),
                ("live_at_end", ctypes.c_size_t), ("unknown_frees", ctypes.c_size_t),
                ("reconstructed", ctypes.c_size_t), ("peak_requested", ctypes.c_uint64)]


REPLAY_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(TraceData),
                             ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)


class ReplayOptions(ctypes.Structure):  # gmr_replay_options_t
    _fields_ = [("check", ctypes.c_int), ("stop_at_oom", ctypes.c_int),
                ("callback", REPLAY_CB), ("ud", ctypes.c_void_p),
                ("callback_every", ctypes.c_size_t)]


class ReplayResult(ctypes.Structure):  # gmr_replay_result_t
    _fields_ = [("events_done", ctypes.c_size_t), ("ooms", ctypes.c_size_t),
                ("first_oom_event", ctypes.c_size_t), ("first_oom_line", ctypes.c_uint32),
                ("first_oom_message", ctypes.c_char * 4096), ("check_failed", ctypes.c_int),
                ("check_event", ctypes.c_size_t), ("check_message", ctypes.c_char * 1024),
                ("seconds", ctypes.c_double), ("at_peak", Stats),
                ("peak_event", ctypes.c_size_t)]


class SimOptions(ctypes.Structure):  # gmr_sim_options_t
    _fields_ = [("capacity", ctypes.c_uint64), ("granularity", ctypes.c_uint64),
                ("host_backed", ctypes.c_int)]


class SimCounters(ctypes.Structure):  # gmr_sim_counters_t: every field uint64_t, in this order
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "reserve_calls", "reserve_failures", "release_calls", "map_calls", "unmap_calls",
        "va_reserve_calls", "va_release_calls", "event_records", "event_queries", "syncs",
        "bytes_in_use", "peak_bytes_in_use", "page_create_calls", "page_release_calls",
        "page_map_calls", "page_unmap_calls", "set_access_calls", "capture_queries", "pages_live",
        "page_maps_live", "unsafe_unmaps")]


class SimCallBytes(ctypes.Structure):  # gmr_sim_call_bytes_t
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "reserve", "release", "va_reserve", "va_release", "map", "unmap", "page_create",
        "page_release", "page_map", "page_unmap", "set_access")]


# gmr-compare's device-call cost model, copied from the table in
# tools/compare-cost.c (Note [Device cost model] there says where each figure
# comes from; python/tests/test_compare.py checks both give the same JSON):
# (key, the counter, measured, us per call, us per 2 MiB page).
COST_MODEL = [
    ("reserve", "reserve_calls", True, 100.0, 0.0),
    ("release", "release_calls", True, 0.0, 0.0),
    ("va_reserve", "va_reserve_calls", True, 14.0, 0.0),
    ("va_release", "va_release_calls", False, 0.0, 0.0),
    ("map", "map_calls", True, 0.0, 53.0),
    ("unmap", "unmap_calls", True, 0.0, 22.0),
    ("page_create", "page_create_calls", True, 0.0, 14.0),
    ("page_release", "page_release_calls", True, 0.0, 15.0),
    ("page_map", "page_map_calls", True, 0.0, 2.0),
    ("page_unmap", "page_unmap_calls", True, 0.0, 22.0),
    ("set_access", "set_access_calls", True, 0.0, 37.0),
    ("event_record", "event_records", False, 0.0, 0.0),
    ("event_query", "event_queries", False, 0.0, 0.0),
    ("sync", "syncs", False, 0.0, 0.0),
]
COST_PAGE = 2097152.0  # the H200's page, the per-page figures' unit


def _device_calls(calls, call_bytes):
    """The JSON's device_calls ... device_time_model, as gmr-compare prints them."""
    count, nbytes, by_call = {}, {}, {}
    total, unmeasured, us_total = 0, 0, 0.0
    for key, counter, measured, per_call, per_page in COST_MODEL:
        n = getattr(calls, counter)
        count[key] = n
        total += n
        if hasattr(call_bytes, key):
            nbytes[key] = getattr(call_bytes, key)
        if not measured:
            unmeasured += n
            continue
        us = n * per_call + nbytes.get(key, 0) / COST_PAGE * per_page
        by_call[key] = float("%.1f" % us)
        us_total += us
    return {"device_calls": count, "device_call_bytes": nbytes, "device_calls_total": total,
            "device_time_us": float("%.1f" % us_total), "device_time_us_by_call": by_call,
            "device_calls_not_estimated": unmeasured,
            "device_time_model": "H200, tools/compare-cost.c"}


def declare(lib):
    vp, i, sz, cp = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_char_p
    sig = {
        "gmr_trace_read": (i, [cp, ctypes.POINTER(ctypes.POINTER(TraceData)), cp, sz]),
        "gmr_trace_data_free": (None, [ctypes.POINTER(TraceData)]),
        "gmr_snapshot_csv": (i, [ctypes.c_char_p, sz, cp, ctypes.POINTER(SnapshotCsvOptions),
                                 ctypes.POINTER(ctypes.POINTER(SnapshotCsv)), cp, sz]),
        "gmr_snapshot_csv_free": (None, [ctypes.POINTER(SnapshotCsv)]),
        "gmr_runtime_new_sim": (i, [vp, ctypes.POINTER(SimOptions), ctypes.POINTER(vp)]),
        "gmr_sim_counters": (i, [vp, ctypes.POINTER(SimCounters)]),
        "gmr_sim_call_bytes": (i, [vp, ctypes.POINTER(SimCallBytes)]),
        "gmr_replay": (i, [vp, ctypes.POINTER(TraceData), ctypes.POINTER(ReplayOptions),
                           ctypes.POINTER(ReplayResult)]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args


def snapshot_csv(lib, data, name, device=None, reconstruct=False, sites=False):
    """gmr_snapshot_csv: (csv text, [warnings], {counts}), or ValueError with
    the library's sentence (MemoryError when out of host memory)."""
    opts = SnapshotCsvOptions(device is not None, device if device is not None else 0,
                              bool(reconstruct), bool(sites))
    out = ctypes.POINTER(SnapshotCsv)()
    msg = ctypes.create_string_buffer(2048)
    rc = lib.gmr_snapshot_csv(bytes(data), len(data), os.fsencode(name), ctypes.byref(opts),
                              ctypes.byref(out), msg, len(msg))
    if rc != 0:
        text = msg.value.decode(errors="replace") or lib.gmr_strerror(rc).decode()
        raise (MemoryError if rc == -1 else ValueError)(text)  # GMR_ENOMEM
    try:
        s = out.contents
        csv = ctypes.string_at(s.csv, s.csv_len).decode(errors="surrogateescape")
        warnings = (s.warnings or b"").decode(errors="replace").splitlines()
        counts = {k: getattr(s, k) for k in ("device", "allocations", "frees", "live_at_end",
                                             "unknown_frees", "reconstructed", "peak_requested")}
    finally:
        lib.gmr_snapshot_csv_free(out)
    return csv, warnings, counts


def fspath_bytes(value, what):
    """A path argument (str, bytes or os.PathLike) as bytes, or TypeError."""
    if isinstance(value, (str, bytes)) or hasattr(value, "__fspath__"):
        path = os.fsencode(os.fspath(value))
        if not path:
            raise ValueError("gmr: %s is an empty path" % what)
        if b"\0" in path:
            raise ValueError("gmr: %s contains a NUL byte" % what)
        return path
    raise TypeError("gmr: %s must be a path (str, bytes or os.PathLike), not %s"
                    % (what, type(value).__name__))


def parse_capacity(lib, capacity):
    """Bytes of a capacity given as an int or a size text ("80GiB")."""
    if isinstance(capacity, bool) or not isinstance(capacity, (int, str, bytes)):
        raise TypeError("gmr: capacity must be an int (bytes) or a size such as '80GiB', not %s"
                        % type(capacity).__name__)
    if isinstance(capacity, int):
        value = capacity
    else:
        text = capacity.encode() if isinstance(capacity, str) else capacity
        out = ctypes.c_uint64()
        if b"\0" in text or lib.gmr_parse_size(text, ctypes.byref(out)) != 0:
            raise ValueError("gmr: capacity %r is not a size (e.g. 80GiB, 143771MiB)"
                             % (capacity,))
        value = out.value
    if value < 2 * MiB or value >= 1 << 64:
        raise ValueError("gmr: capacity must be at least 2MiB and below 2**64 bytes, not %d"
                         % value)
    return value


def find_config(lib, name):
    """The file a configuration argument names: a path ('/' in it, or an
    existing file), else NAME or NAME.yaml in ./config, in the configurations
    bundled with this package, then where gmr_config_find looks (the
    installed share directory).  ValueError when none has it."""
    raw = fspath_bytes(name, "config")
    if b"/" in raw or os.path.isfile(raw):
        return raw
    here = os.fsencode(os.path.join(os.path.dirname(os.path.abspath(__file__)), "config"))
    for d in (b"config", here):
        for suffix in (b"", b".yaml"):
            path = os.path.join(d, raw + suffix)
            if os.path.isfile(path):
                return path
    buf = ctypes.create_string_buffer(4096)
    if lib.gmr_config_find(raw, buf, len(buf)) == 0:
        return buf.value
    raise ValueError("gmr: no configuration named %r (looked for it and %s.yaml in ./config, "
                     "%s and %s)" % (os.fsdecode(raw), os.fsdecode(raw), os.fsdecode(here),
                                     lib.gmr_config_dir().decode(errors="replace")))


def _base_name(path):
    b = os.path.basename(os.fsdecode(path))
    for ext in (".yaml", ".yml"):
        if len(b) > len(ext) and b.endswith(ext):
            return b[:-len(ext)]
    return b


class _Trace:
    """A parsed trace, freed with the object (context manager)."""

    def __init__(self, lib, path):
        self.lib = lib
        self.ptr = ctypes.POINTER(TraceData)()
        msg = ctypes.create_string_buffer(1024)
        rc = lib.gmr_trace_read(path, ctypes.byref(self.ptr), msg, len(msg))
        if rc != 0:
            text = msg.value.decode(errors="replace") or lib.gmr_strerror(rc).decode()
            if rc == -7:  # GMR_EIO: the file could not be read
                raise OSError("gmr: %s" % text)
            raise ValueError("gmr: %s" % text)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.lib.gmr_trace_data_free(self.ptr)
        self.ptr = None


def _runtime(lib, cfg, capacity):
    rt = ctypes.c_void_p()
    sim = SimOptions(capacity=capacity)
    rc = lib.gmr_runtime_new_sim(cfg, ctypes.byref(sim), ctypes.byref(rt))
    if rc != 0:
        raise GmrError(rc, "cannot create the runtime: %s" % lib.gmr_strerror(rc).decode())
    return rt


def _replay_one(lib, cfg, trace, capacity, check):
    """The two passes; returns (result, final stats, policy, driver calls) or
    raises GmrError with the run's error text."""
    t = trace.ptr
    rt = _runtime(lib, cfg, capacity)
    res, final = ReplayResult(), Stats()
    calls, call_bytes = SimCounters(), SimCallBytes()
    try:
        policy = lib.gmr_runtime_policy(rt).decode()
        opts = ReplayOptions(check=1 if check else 0, stop_at_oom=0)
        rc = lib.gmr_replay(rt, t, ctypes.byref(opts), ctypes.byref(res))
        if rc != 0:
            raise GmrError(rc, "the replay failed: %s" % lib.gmr_strerror(rc).decode())
        lib.gmr_stats(rt, ctypes.byref(final))
        lib.gmr_sim_counters(rt, ctypes.byref(calls))  # the calls the replay made
        lib.gmr_sim_call_bytes(rt, ctypes.byref(call_bytes))
    finally:
        lib.gmr_runtime_free(rt)
    devcalls = _device_calls(calls, call_bytes)
    if res.check_failed:
        return res, final, policy, devcalls
    # The peak event: reserved at its maximum, the most allocated among those.
    peak = {"found": False, "event": res.peak_event, "stats": Stats()}
    st = Stats()

    def track(rt_, t_, index, status, ud):
        if lib.gmr_stats(rt_, ctypes.byref(st)) == 0 and \
                st.reserved_bytes == final.peak_reserved_bytes and \
                (not peak["found"] or st.allocated_bytes > peak["stats"].allocated_bytes):
            peak["found"] = True
            peak["event"] = index
            peak["stats"] = Stats.from_buffer_copy(st)
        return 0

    cb = REPLAY_CB(track)
    rt = _runtime(lib, cfg, capacity)
    again = ReplayResult()
    try:
        opts = ReplayOptions(check=0, stop_at_oom=0, callback=cb, callback_every=1)
        rc = lib.gmr_replay(rt, t, ctypes.byref(opts), ctypes.byref(again))
        if rc != 0:
            raise GmrError(rc, "the replay failed: %s" % lib.gmr_strerror(rc).decode())
    finally:
        lib.gmr_runtime_free(rt)
    if peak["found"]:
        res.at_peak = peak["stats"]
        res.peak_event = peak["event"]
    return res, final, policy, devcalls


def _top_sites(t, at):
    """The call sites holding the most requested bytes after event `at`, as
    gmr-compare ranks them: bytes(site) = sum of size(id) over the ids live
    after `at` with that site; largest first, ties by the site seen first;
    allocations with no site under "(no call site)"."""
    if t.n_sites == 0 or t.n_events == 0:
        return []
    at = min(at, t.n_events - 1)
    live = {}
    for i in range(at + 1):
        e = t.events[i]
        if e.action == ALLOC:
            live[e.id] = (e.site if e.site <= t.n_sites else 0, e.size)
        elif e.action == FREE:
            live.pop(e.id, None)
    totals = {}
    for site, size in live.values():
        b, n = totals.get(site, (0, 0))
        totals[site] = (b + size, n + 1)
    ranked = sorted(((b, n, s) for s, (b, n) in totals.items() if b > 0),
                    key=lambda x: (-x[0], x[2]))[:TOP_SITES]

    def name(s):
        return t.sites[s - 1].decode(errors="replace") if 1 <= s <= t.n_sites \
            else "(no call site)"
    return [{"site": name(s), "bytes": b, "allocations": n} for b, n, s in ranked]


def _figures(out, res, final, trace):
    p = res.at_peak
    free = p.free_cached_bytes
    largest = min(p.largest_free_block, free)
    rounding = p.allocated_bytes - p.requested_bytes if p.allocated_bytes > p.requested_bytes else 0
    t = trace.ptr.contents
    out.update({
        "events": res.events_done,
        "peak_reserved": final.peak_reserved_bytes,
        "peak_allocated": final.peak_allocated_bytes,
        "peak_requested": final.peak_requested_bytes,
        "reserved_over_requested": (round(final.peak_reserved_bytes / final.peak_requested_bytes, 4)
                                    if final.peak_requested_bytes else None),
        "peak_event": res.peak_event,
        "peak_line": t.events[res.peak_event].line if res.peak_event < t.n_events else 0,
        "free_at_peak": free,
        "largest_free_at_peak": largest,
        "fragmentation_at_peak": round(1.0 - largest / free, 4) if free else 0.0,
        "rounding_loss_at_peak": rounding,
        "segments_peak": final.peak_segments,
        "device_allocs": final.device_allocs,
        "device_frees": final.device_frees,
        "ooms": res.ooms,
        "first_oom": ({"event": res.first_oom_event, "line": res.first_oom_line,
                       "message": res.first_oom_message.decode(errors="replace")}
                      if res.ooms else None),
        "alloc_retries": final.alloc_retries,
        "top_sites": _top_sites(t, res.peak_event),
        "seconds": round(res.seconds, 6),
        "events_per_second": round(res.events_done / res.seconds) if res.seconds > 0 else 0,
    })


def compare(lib, trace, configs, capacity=DEFAULT_CAPACITY, check=False):
    trace_path = fspath_bytes(trace, "trace")
    if trace_path == b"-":
        raise ValueError("gmr: trace must be a file ('-', standard input, is for gmr-compare)")
    if isinstance(configs, (str, bytes)) or hasattr(configs, "__fspath__"):
        configs = [configs]
    try:
        configs = list(configs)
    except TypeError:
        raise TypeError("gmr: configs must be a configuration (a path or a name) or a list "
                        "of them, not %s" % type(configs).__name__) from None
    if not configs:
        raise ValueError("gmr: give at least one configuration (a path or a name such as "
                         "'pytorch')")
    if not isinstance(check, bool):
        raise TypeError("gmr: check must be True or False, not %r" % (check,))
    cap = parse_capacity(lib, capacity)
    paths = [find_config(lib, c) for c in configs]  # every name is checked before any work
    from ._lib import Error

    runs = []
    with _Trace(lib, trace_path) as t:
        tdata = t.ptr.contents
        trace_name = tdata.source.decode(errors="replace")
        for path in paths:
            run = {"config": _base_name(path), "source": os.fsdecode(path), "status": "ok",
                   "error": None, "trace": trace_name,
                   "trace_format": "pytorch_snapshot" if tdata.format == 1 else "csv",
                   "trace_alloc_failures": tdata.n_alloc_failures}
            runs.append(run)
            cfg, err = ctypes.c_void_p(), Error()
            rc = lib.gmr_config_load_file(path, ctypes.byref(cfg), ctypes.byref(err))
            if rc != 0:
                run["status"] = "load_error"
                run["error"] = err.message.decode(errors="replace") or \
                    lib.gmr_strerror(rc).decode()
                continue
            try:
                res, final, policy, devcalls = _replay_one(lib, cfg, t, cap, check)
            except GmrError as e:
                run["status"], run["error"] = "runtime_error", str(e)
                continue
            finally:
                lib.gmr_config_free(cfg)
            run["policy"] = policy
            _figures(run, res, final, t)
            run.update(devcalls)
            if res.check_failed:
                run["status"] = "check_failed"
                run["error"] = "stopped after event %d: %s" % (
                    res.check_event, res.check_message.decode(errors="replace"))
    return runs
