"""Replay a trace recorded with GMR_TRACE on gmr's simulated device under a
configuration, and print the replay's peak reserved and allocated bytes as
JSON (what the policy predicts for the recorded run).

    python3 replay_check.py TRACE CONFIG [--capacity BYTES]

Uses libgmr's gmr_trace_read, gmr_runtime_new_sim and gmr_replay through
ctypes; needs no GPU.
"""

import ctypes
import json
import sys

import gmr
from gmr._lib import Error, Stats


class SimOptions(ctypes.Structure):  # gmr_sim_options_t
    _fields_ = [("capacity", ctypes.c_uint64), ("granularity", ctypes.c_uint64),
                ("host_backed", ctypes.c_int)]


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    trace, config = sys.argv[1], sys.argv[2]
    capacity = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--capacity" else 150109880320
    lib = gmr._library()
    vp = ctypes.c_void_p
    lib.gmr_trace_read.argtypes = [ctypes.c_char_p, ctypes.POINTER(vp), ctypes.c_char_p, ctypes.c_size_t]
    lib.gmr_runtime_new_sim.argtypes = [vp, ctypes.POINTER(SimOptions), ctypes.POINTER(vp)]
    lib.gmr_replay.argtypes = [vp, vp, vp, vp]
    lib.gmr_runtime_free.argtypes = [vp]
    lib.gmr_trace_data_free.argtypes = [vp]

    t = vp()
    msg = ctypes.create_string_buffer(1024)
    if lib.gmr_trace_read(trace.encode(), ctypes.byref(t), msg, 1024) != 0:
        print("replay_check: %s" % msg.value.decode())
        return 1
    cfg, err = vp(), Error()
    if lib.gmr_config_load_file(config.encode(), ctypes.byref(cfg), ctypes.byref(err)) != 0:
        print("replay_check: %s" % err.message.decode())
        return 1
    rt = vp()
    opts = SimOptions(capacity, 0, 0)
    if lib.gmr_runtime_new_sim(cfg, ctypes.byref(opts), ctypes.byref(rt)) != 0:
        print("replay_check: no simulated runtime: %s" % lib.gmr_hooks_last_error().decode())
        return 1
    result = ctypes.create_string_buffer(64 * 1024)  # gmr_replay_result_t, read through gmr_stats
    rc = lib.gmr_replay(rt, t, None, result)
    st = Stats()
    lib.gmr_stats(rt, ctypes.byref(st))
    ooms = ctypes.c_size_t.from_buffer(result, ctypes.sizeof(ctypes.c_size_t)).value
    print(json.dumps({"trace": trace, "config": config, "rc": rc, "ooms": ooms,
                      "policy": lib.gmr_runtime_policy(rt).decode(),
                      "peak_reserved": st.peak_reserved_bytes,
                      "peak_allocated": st.peak_allocated_bytes,
                      "num_allocs": st.num_allocs, "device_allocs": st.device_allocs}))
    lib.gmr_runtime_free(rt)
    lib.gmr_config_free(cfg)
    lib.gmr_trace_data_free(t)
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
