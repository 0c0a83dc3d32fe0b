"""One memory cap shared by two processes on one GPU (limit.shared).

    python3 shared_cap.py --top BIN/gmr-top --preload LIB/libgmr-preload.so \
        [--cap-gib 60] [--quota-gib 40] [--hold-gib 30] [--results DIR]

Starts two worker processes of this same script, each under the interposer
(LD_PRELOAD, so cudaMemGetInfo is gmr's) and each with its own quota under
one shared cap smaller than the sum of the quotas:
  A: PyTorch through gmr's hooks (gmr.use_in_torch), label torch-A;
  B: CuPy through gmr's hooks (gmr.use_in_cupy), label cupy-B.
The file is the default one, /dev/shm/gmr-cap-<uid>-<GPU UUID>, of the
first device in CUDA_VISIBLE_DEVICES (default 0).  Then:
  1. A takes --hold-gib in 1 GiB tensors; B takes 1 GiB arrays until CuPy
     raises its OutOfMemoryError: B gets only cap - hold (not its quota);
  2. A asks for 1 GiB more: torch.OutOfMemoryError;
  3. torch.cuda.mem_get_info in A and CuPy's memGetInfo in B report the quota
     as total and what the cap leaves as free;
  4. NVML's per-process figures (nvidia-smi --query-compute-apps) sum to no
     more than the cap plus both processes' CUDA contexts (measured before
     they allocate) plus a small slack;
  5. gmr-top --json lists both, committed <= cap;
  6. kill -9 A; B grows again until its OOM: now up to its quota, into the
     memory A held;
  7. gmr-top --json after.
Prints "ok"/"FAIL" lines and writes results JSON to --results; exits 1 on any
failure, 0 with "SKIP" without a device.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

GiB = 1 << 30
MiB = 1 << 20
failures = []


def check(cond, what):
    print("%s - %s" % ("ok" if cond else "FAIL", what), flush=True)
    if not cond:
        failures.append(what)
    return cond


# ---- the workers ----------------------------------------------------------------------

def worker(kind):
    import gmr
    cfg = os.environ["GMR_CONFIG"]
    held = []
    if kind == "torch":
        import torch
        gmr.use_in_torch(cfg)
        torch.ones(1, device="cuda").sum().item()  # context and gmr runtime up
        oom_type = torch.OutOfMemoryError

        def alloc_gib():
            return torch.ones(GiB // 4, dtype=torch.float32, device="cuda")

        def meminfo():
            return torch.cuda.mem_get_info()

        def total_sum():
            return float(sum(float(t.sum()) for t in held))
    else:
        import cupy
        gmr.use_in_cupy(cfg)
        cupy.ones(1).sum().item()
        oom_type = cupy.cuda.memory.OutOfMemoryError

        def alloc_gib():
            return cupy.ones(GiB // 4, dtype=cupy.float32)

        def meminfo():
            return cupy.cuda.runtime.memGetInfo()

        def total_sum():
            return float(sum(float(a.sum()) for a in held))

    def reply(**kw):
        sys.stdout.write(json.dumps(kw) + "\n")
        sys.stdout.flush()

    reply(ready=os.getpid())
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "grow":  # grow MAX_GIB: 1 GiB at a time until OOM or MAX_GIB held
            limit = int(cmd[1])
            err = None
            while len(held) < limit:
                try:
                    held.append(alloc_gib())
                except oom_type as e:  # the framework's own OOM
                    err = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:400])
                    break
                except Exception as e:  # noqa: BLE001 (anything else is a failure)
                    err = "UNEXPECTED %s: %s" % (type(e).__name__, str(e)[:400])
                    break
            ok_sum = total_sum() == float(len(held) * (GiB // 4))
            reply(held_gib=len(held), error=err, sums_right=ok_sum)
        elif cmd[0] == "meminfo":
            free, total = meminfo()
            reply(free=int(free), total=int(total))
        elif cmd[0] == "stats":
            s = gmr.stats(0)
            reply(**{k: s.get(k) for k in ("reserved_bytes", "limit_bytes", "limit_shared_cap_bytes",
                                            "limit_shared_committed_bytes",
                                            "limit_shared_free_bytes", "ooms")})
        elif cmd[0] == "exit":
            reply(bye=True)
            return 0
    return 0


# ---- the orchestrator ------------------------------------------------------------------

class Worker:
    def __init__(self, kind, env):
        self.kind = kind
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", kind],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                  text=True, bufsize=1)
        self.pid = self.p.pid

    def read(self, timeout=300):
        deadline = time.time() + timeout
        while time.time() < deadline:
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError("%s worker exited (rc %s)" % (self.kind, self.p.poll()))
            line = line.strip()
            if line.startswith("{"):
                return json.loads(line)
            print("   [%s] %s" % (self.kind, line))
        raise RuntimeError("%s worker: no answer in %d s" % (self.kind, timeout))

    def ask(self, cmd):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        return self.read()


def nvml_apps():
    """{pid: used bytes} from NVML's per-process figures."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    apps = {}
    for line in out.strip().splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            apps[int(parts[0])] = int(parts[1]) * MiB
    return apps


def top_json(top):
    r = subprocess.run([top, "--json"], capture_output=True, text=True)
    try:
        return json.loads(r.stdout)
    except ValueError:
        print("   gmr-top: %s %s" % (r.stdout[:500], r.stderr[:500]))
        return {"files": []}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker")
    ap.add_argument("--top")
    ap.add_argument("--preload")
    ap.add_argument("--cap-gib", type=int, default=60)
    ap.add_argument("--quota-gib", type=int, default=40)
    ap.add_argument("--hold-gib", type=int, default=30)
    ap.add_argument("--results", default=os.environ.get("RESULTS", "/tmp/gmr-results"))
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker)
    try:
        found = subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
    except OSError:
        found = False
    if not found:
        print("SKIP: no CUDA device (nvidia-smi -L failed)")
        return 0
    os.makedirs(a.results, exist_ok=True)
    # The device the workers see first (CUDA_VISIBLE_DEVICES: an index or a
    # UUID; nvidia-smi itself ignores that variable).
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip() or "0"
    uuid = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i",
                           visible], capture_output=True, text=True).stdout.strip()
    default = "/dev/shm/gmr-cap-%d-%s" % (os.getuid(), uuid)
    print("GPU %s: %s; the shared-cap file: %s" % (visible, uuid, default))
    if os.path.exists(default):
        t = subprocess.run([a.top, "--json", default], capture_output=True, text=True)
        live = json.loads(t.stdout)["files"][0]["live"] if t.returncode == 0 else 0
        if live:
            print("FAIL - %s has %d live processes: run this on an idle GPU" % (default, live))
            return 1
        os.unlink(default)  # left by an earlier run, nobody attached

    tmp = tempfile.mkdtemp(prefix="gmr-shared-cap-")
    cfgs = {}
    for kind, label in (("torch", "torch-A"), ("cupy", "cupy-B")):
        path = os.path.join(tmp, kind + ".yaml")
        with open(path, "w") as f:
            f.write("policy: caching\n"
                    "limit:\n  bytes: %dGiB\n  counts: reserved\n"
                    "  shared: {cap: %dGiB, label: %s}\n" % (a.quota_gib, a.cap_gib, label))
        cfgs[kind] = path
    print("configuration of A:\n" + open(cfgs["torch"]).read())
    cap, quota = a.cap_gib * GiB, a.quota_gib * GiB
    check(cap < 2 * quota, "the cap (%d GiB) is below the sum of the quotas (2 x %d GiB)" %
          (a.cap_gib, a.quota_gib))
    results = {"uuid": uuid, "cap": cap, "quota": quota}

    def env_for(kind):
        e = dict(os.environ)
        e["GMR_CONFIG"] = cfgs[kind]
        e["LD_PRELOAD"] = a.preload + (":" + e["LD_PRELOAD"] if e.get("LD_PRELOAD") else "")
        e["PYTHONUNBUFFERED"] = "1"
        return e

    A = Worker("torch", env_for("torch"))
    A.read()
    time.sleep(1)
    ctx_a = nvml_apps().get(A.pid, 0)
    B = Worker("cupy", env_for("cupy"))
    B.read()
    time.sleep(1)
    ctx_b = nvml_apps().get(B.pid, 0)
    print("CUDA contexts (NVML, before any allocation): A %.2f GiB, B %.2f GiB" %
          (ctx_a / GiB, ctx_b / GiB))
    check(ctx_a > 0 and ctx_b > 0, "NVML reports both processes (pids %d, %d)" % (A.pid, B.pid))
    results["contexts"] = [ctx_a, ctx_b]

    r = A.ask("grow %d" % a.hold_gib)
    check(r["held_gib"] == a.hold_gib and r["error"] is None and r["sums_right"],
          "A (PyTorch) holds %d GiB" % r["held_gib"])
    r = B.ask("grow %d" % a.quota_gib)
    room = a.cap_gib - a.hold_gib
    check(r["error"] is not None and r["error"].startswith("OutOfMemoryError") and
          room - 1 <= r["held_gib"] <= room and r["sums_right"],
          "B (CuPy) gets %d GiB, what the cap leaves (%d GiB, not its %d GiB quota), then "
          "CuPy's OutOfMemoryError" % (r["held_gib"], room, a.quota_gib))
    print("   B's error: %s" % r["error"])
    b_held = r["held_gib"]
    results["b_before"] = r
    r = A.ask("grow %d" % (a.hold_gib + 1))
    check(r["error"] is not None and r["error"].startswith("OutOfMemoryError") and
          r["held_gib"] == a.hold_gib, "A asks for 1 GiB more: torch.OutOfMemoryError")
    print("   A's error: %s" % r["error"])
    results["a_oom"] = r
    for w, held in ((A, a.hold_gib), (B, b_held)):
        m = w.ask("meminfo")
        left = cap - (a.hold_gib + b_held) * GiB
        check(m["total"] == quota and m["free"] <= max(left, 0) + 64 * MiB,
              "%s's memory info: total %.2f GiB = its quota, free %.2f GiB = what the cap leaves "
              "(%.2f GiB)" % (w.kind, m["total"] / GiB, m["free"] / GiB, left / GiB))
        results["meminfo_" + w.kind] = m
    apps = nvml_apps()
    used_a, used_b = apps.get(A.pid, 0), apps.get(B.pid, 0)
    slack = 512 * MiB
    check(used_a + used_b <= cap + ctx_a + ctx_b + slack,
          "NVML: A %.2f + B %.2f = %.2f GiB <= cap %.0f GiB + contexts %.2f GiB (+0.5 GiB slack)" %
          (used_a / GiB, used_b / GiB, (used_a + used_b) / GiB, cap / GiB, (ctx_a + ctx_b) / GiB))
    results["nvml_both"] = {"A": used_a, "B": used_b}
    t = top_json(a.top)
    f = [x for x in t["files"] if x["device"] == uuid]
    check(len(f) == 1 and f[0]["live"] == 2 and f[0]["committed"] <= cap and
          {p["label"] for p in f[0]["processes"]} == {"torch-A", "cupy-B"},
          "gmr-top --json: the file of GPU %s, two processes (torch-A, cupy-B), committed %.2f "
          "GiB <= cap" % (uuid, (f[0]["committed"] if f else 0) / GiB))
    results["top_both"] = t
    print(subprocess.run([a.top, "--once"], capture_output=True, text=True).stdout)

    A.p.send_signal(signal.SIGKILL)
    A.p.wait()
    for _ in range(60):  # the driver frees a killed process's memory shortly after
        if A.pid not in nvml_apps():
            break
        time.sleep(0.5)
    check(A.pid not in nvml_apps(), "A is killed with SIGKILL and gone from NVML")
    r = B.ask("grow %d" % a.quota_gib)
    check(r["held_gib"] >= a.quota_gib - 1 and r["held_gib"] > b_held and
          r["error"] is not None and r["error"].startswith("OutOfMemoryError") and r["sums_right"],
          "B grows from %d to %d GiB into A's freed memory, up to its %d GiB quota" %
          (b_held, r["held_gib"], a.quota_gib))
    print("   B's error at its quota: %s" % r["error"])
    results["b_after"] = r
    apps = nvml_apps()
    used_b = apps.get(B.pid, 0)
    check(used_b <= min(cap, quota) + ctx_b + slack,
          "NVML: B %.2f GiB <= its quota + context" % (used_b / GiB))
    s = B.ask("stats")
    print("   B's gmr statistics: %s" % s)
    t = top_json(a.top)
    f = [x for x in t["files"] if x["device"] == uuid]
    check(len(f) == 1 and f[0]["live"] == 1 and f[0]["processes"][0]["label"] == "cupy-B",
          "gmr-top after kill -9 of A: only cupy-B is attached")
    results["top_after"] = t
    print(subprocess.run([a.top, "--once"], capture_output=True, text=True).stdout)
    B.ask("exit")
    B.p.wait()
    results["failures"] = failures
    with open(os.path.join(a.results, "shared-cap.json"), "w") as fo:
        json.dump(results, fo, indent=1)
    print("%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
