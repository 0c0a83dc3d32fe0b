"""Sleep and wake on a GPU (docs/sleep-wake.md): a model's weights and optimizer
state give their device memory back and take it again at the same addresses.

    python3 scripts/gpu/sleep_wake.py --policy caching|expandable|stitch
                                      [--cycles 1000] [--out DIR]

Installs gmr (gmr.use_in_torch, the native adapter) with config/pytorch.yaml,
pytorch-expandable.yaml or stitch.yaml, builds GPT-2 medium (random init, no
download) and its AdamW state inside `with gmr.region("model")`, then:
  - cycles: `--cycles` offload sleeps and wakes keeping the pinned host
    buffer between them (keep_host=True); every 50th wake and the last
    compare the model's logits on a fixed batch bit for bit with the first
    ones, and at the end every parameter and optimizer tensor with a host
    copy taken before the first sleep; the process's device memory by NVML
    (nvidia-smi when pynvml is missing) and gmr's tag figures are the same
    after the first and the last wake (0 bytes leaked), and the process's
    resident host memory has not grown by the offloaded size (#16663);
  - host-return: 5 cycles without keep_host: each wake gives the host
    buffer back (in the background: the script waits 0.5 s), so the
    process's resident host memory falls by the buffer's size;
  - timing: median wake time, with and without keep_host, against the
    pinned host-to-device copy of the same bytes measured in the same run
    (within 1.2x), and the median sleep times;
  - turns: two models, each with a CUDA graph of its forward captured before
    its first sleep, take turns under one memory fraction that holds one
    awake model but not two: waking the second while the first is awake is
    refused with gmr's sentence, and every replay after a wake gives the
    outputs of the replay before the first sleep.
Each item prints `CHECK <name> ok <detail>` or `CHECK <name> FAIL <detail>`;
DIR gets sleep_wake-<policy>.json.  Exit status 1 when a check failed; 0
with "SKIP" without torch or a CUDA device.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = {"caching": "pytorch.yaml", "expandable": "pytorch-expandable.yaml",
           "stitch": "stitch.yaml"}
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

results = {"checks": {}}
failed = []


def check(name):
    def wrap(fn):
        t0 = time.time()
        try:
            detail = fn()
            line = "CHECK %s ok%s" % (name, (" " + detail) if detail else "")
            results["checks"][name] = {"ok": True, "detail": detail,
                                       "seconds": round(time.time() - t0, 3)}
        except Exception as e:  # noqa: BLE001: every failure is a result
            msg = ("%s: %s" % (type(e).__name__, e)).replace("\n", " | ")[:800]
            line = "CHECK %s FAIL %s" % (name, msg)
            results["checks"][name] = {"ok": False, "detail": msg,
                                       "traceback": traceback.format_exc()[-4000:]}
            failed.append(name)
        print(line, flush=True)
        return fn
    return wrap


def need(cond, what):
    if not cond:
        raise AssertionError(what)


def nvml_used():
    """This process's device memory in bytes, by NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(int(os.environ.get("CUDA_VISIBLE_DEVICES", "0")
                                                  .split(",")[0] or 0))
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            if p.pid == os.getpid():
                return int(p.usedGpuMemory)
        return 0
    except Exception:  # noqa: BLE001: fall back to nvidia-smi
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], stdout=subprocess.PIPE,
                             universal_newlines=True, timeout=30).stdout
        for line in out.splitlines():
            pid, mib = [x.strip() for x in line.split(",")[:2]]
            if int(pid) == os.getpid():
                return int(mib) << 20
        return 0


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def gpt2_medium(torch):
    from transformers import GPT2Config, GPT2LMHeadModel

    try:
        cfg = GPT2Config(n_positions=1024, n_layer=24, n_embd=1024, n_head=16,
                         attn_implementation="eager")
    except TypeError:
        cfg = GPT2Config(n_positions=1024, n_layer=24, n_embd=1024, n_head=16)
    return GPT2LMHeadModel(cfg), cfg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", choices=sorted(CONFIGS), default="caching")
    ap.add_argument("--cycles", type=int, default=1000)
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("SKIP: no torch")
        return 0
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 0
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import gmr

    os.environ["GMR_TORCH_ADAPTER"] = "native"
    gmr.use_in_torch(os.path.join(ROOT, "config", CONFIGS[a.policy]))
    results.update(policy=a.policy, gmr=gmr.policy(0), torch=torch.__version__,
                   device=torch.cuda.get_device_name(0), cycles=a.cycles)
    print("gmr %s, torch %s, %s" % (results["gmr"], torch.__version__, results["device"]))
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    state = {}

    @check("build")
    def _build():
        with gmr.region("model"):
            model, cfg = gpt2_medium(torch)
            model = model.cuda()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            batch = torch.randint(0, cfg.vocab_size, (4, 256), device="cuda")
            loss = model(batch, labels=batch).loss
            loss.backward()
            opt.step()  # the optimizer state is allocated here, inside the region
            opt.zero_grad(set_to_none=True)
        model.eval()
        x = torch.randint(0, cfg.vocab_size, (2, 128), device="cuda",
                          generator=torch.Generator(device="cuda").manual_seed(7))
        with torch.no_grad():
            ref = model(x).logits.clone()
        tensors = list(model.parameters()) + [v for s in opt.state.values() for v in s.values()
                                              if torch.is_tensor(v) and v.is_cuda]
        host = [t.detach().cpu().clone() for t in tensors]
        ptrs = [t.data_ptr() for t in tensors]
        torch.cuda.synchronize()
        state.update(model=model, opt=opt, x=x, ref=ref, tensors=tensors, host=host, ptrs=ptrs)
        t = gmr.tag_info("model")
        n = sum(p.numel() for p in model.parameters())
        need(t["mapped_bytes"] > 0, "the region tagged nothing: %s" % t)
        return "GPT-2 medium, %d parameters; tag maps %d bytes" % (n, t["mapped_bytes"])

    def logits():
        with torch.no_grad():
            return state["model"](state["x"]).logits

    @check("cycles")
    def _cycles():
        need("model" in state, "no model")
        sleeps, wakes, mismatches = [], [], []
        first = None
        for i in range(a.cycles):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            gmr.sleep("model", mode="offload", keep_host=True)
            t1 = time.perf_counter()
            gmr.wake("model")
            t2 = time.perf_counter()
            sleeps.append(t1 - t0)
            wakes.append(t2 - t1)
            if i % 50 == 0 or i == a.cycles - 1:
                if not torch.equal(logits(), state["ref"]):
                    mismatches.append(i)
            if i == 0:  # after the forward, as `last` is: its cached blocks count in both
                torch.cuda.synchronize()
                first = (nvml_used(), gmr.tag_info("model"), rss_bytes(),
                         torch.cuda.mem_get_info()[0])
        torch.cuda.synchronize()
        last = (nvml_used(), gmr.tag_info("model"), rss_bytes(), torch.cuda.mem_get_info()[0])
        same = all(torch.equal(t.detach().cpu(), h) for t, h in zip(state["tensors"],
                                                                     state["host"]))
        moved = [t.data_ptr() for t in state["tensors"]] != state["ptrs"]
        gmr.sleep("model", mode="offload", keep_host=True)
        asleep_info = gmr.tag_info("model")
        asleep_nvml = nvml_used()
        gmr.wake("model")
        results["cycles_figures"] = {
            "sleep_s_median": statistics.median(sleeps), "wake_s_median": statistics.median(wakes),
            "nvml_first": first[0], "nvml_last": last[0], "rss_first": first[2],
            "rss_last": last[2], "tag_first": first[1], "tag_last": last[1],
            "tag_asleep": asleep_info, "nvml_asleep": asleep_nvml}
        need(not mismatches, "logits differ after wakes %s" % mismatches[:10])
        need(same, "a parameter or optimizer tensor changed")
        need(not moved, "a tensor moved")
        need(last[0] == first[0], "NVML: %d bytes after the first wake, %d after the last"
             % (first[0], last[0]))
        need(last[1]["mapped_bytes"] == first[1]["mapped_bytes"] and
             last[1]["offloaded_bytes"] == 0, "gmr's tag figures moved: %s -> %s"
             % (first[1], last[1]))
        need(last[2] - first[2] < max(64 << 20, first[1]["mapped_bytes"] // 10),
             "host memory grew by %d bytes across the cycles" % (last[2] - first[2]))
        need(asleep_nvml < first[0] - asleep_info["sleeping_bytes"] // 2,
             "asleep, NVML still shows %d bytes (awake %d)" % (asleep_nvml, first[0]))
        return ("%d cycles bit-identical; NVML %d = %d bytes; asleep %d bytes given back; "
                "sleep %.1f ms, wake %.1f ms (medians)"
                % (a.cycles, first[0], last[0], asleep_info["sleeping_bytes"],
                   1e3 * statistics.median(sleeps), 1e3 * statistics.median(wakes)))

    @check("host-return")
    def _host_return():
        need("cycles_figures" in results, "no cycles")
        kept = gmr.tag_info("model")["host_kept_bytes"]
        need(kept > 0, "keep_host kept no buffer: %s" % gmr.tag_info("model"))
        time.sleep(0.5)
        rss_kept = rss_bytes()
        sleeps, wakes, rss = [], [], []
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            gmr.sleep("model", mode="offload")
            t1 = time.perf_counter()
            gmr.wake("model")
            t2 = time.perf_counter()
            sleeps.append(t1 - t0)
            wakes.append(t2 - t1)
            time.sleep(0.5)  # the buffer is given back by a thread of its own
            rss.append(rss_bytes())
        t = gmr.tag_info("model")
        results["host_return"] = {"kept_bytes": kept, "rss_kept": rss_kept, "rss_after": rss,
                                  "sleep_s_median": statistics.median(sleeps),
                                  "wake_s_median": statistics.median(wakes)}
        need(t["host_kept_bytes"] == 0, "a buffer is still kept: %s" % t)
        need(torch.equal(logits(), state["ref"]), "the logits differ")
        need(max(rss) < rss_kept - kept * 9 // 10,
             "resident host memory %s after the wakes, %d with the %d bytes kept"
             % (rss, rss_kept, kept))
        return ("host memory %d -> %d bytes (kept buffer %d given back at each wake); "
                "sleep %.1f ms, wake %.1f ms (medians)"
                % (rss_kept, max(rss), kept, 1e3 * statistics.median(sleeps),
                   1e3 * statistics.median(wakes)))

    @check("timing")
    def _timing():
        need("cycles_figures" in results and "host_return" in results, "no cycles")
        n = gmr.tag_info("model")["mapped_bytes"]
        src = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        dst = torch.empty(n, dtype=torch.uint8, device="cuda")
        bound = []
        for _ in range(10):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            bound.append(time.perf_counter() - t0)
        del src, dst
        torch.cuda.empty_cache()
        wake = results["cycles_figures"]["wake_s_median"]
        wake_free = results["host_return"]["wake_s_median"]
        b = statistics.median(bound)
        results["timing"] = {"bytes": n, "h2d_s_median": b, "wake_s_median": wake,
                             "ratio": wake / b, "wake_s_median_no_keep": wake_free,
                             "ratio_no_keep": wake_free / b,
                             "sleep_s_median": results["cycles_figures"]["sleep_s_median"],
                             "sleep_s_median_no_keep": results["host_return"]["sleep_s_median"]}
        detail = ("wake %.2f ms for %d bytes (%.2f ms without keep_host), H2D bound %.2f ms "
                  "(%.1f GB/s): %.2fx (%.2fx); sleep %.2f ms (%.2f ms)"
                  % (1e3 * wake, n, 1e3 * wake_free, 1e3 * b, n / b / 1e9, wake / b,
                     wake_free / b, 1e3 * results["cycles_figures"]["sleep_s_median"],
                     1e3 * results["host_return"]["sleep_s_median"]))
        need(wake <= 1.2 * b and wake_free <= 1.2 * b, detail)
        return detail

    @check("turns")
    def _turns():
        need("model" in state, "no model")
        gmr.sleep("model", mode="offload")  # the first model is out of the way
        models = {}
        for name in ("a", "b"):
            with gmr.region(name):
                m, cfg = gpt2_medium(torch)
                m = m.cuda().eval()
            # The graph runs the model's 24 MLP blocks and its head on a fixed
            # hidden state: every kernel reads the tagged weights, and nothing in
            # it copies from the host (the whole forward builds its mask there).
            x = torch.randn(2, 128, cfg.n_embd, device="cuda")

            def body(m=m, x=x):
                h = x
                for blk in m.transformer.h:
                    h = h + blk.mlp(blk.ln_2(h))
                return m.lm_head(m.transformer.ln_f(h))

            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s), torch.no_grad():
                for _ in range(3):
                    body()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g), torch.no_grad():
                out = body()
            g.replay()
            torch.cuda.synchronize()
            models[name] = (m, x, g, out, out.clone())
            gmr.sleep(name, mode="offload")
        torch.cuda.empty_cache()
        one = gmr.tag_info("a")["sleeping_bytes"]
        total = torch.cuda.mem_get_info()[1]
        st = gmr.stats(0)
        held = st["reserved_bytes"] - st["sleeping_bytes"]  # what gmr holds on the device now
        frac = (held + one + one // 2) / total  # one model fits beside it, two do not
        torch.cuda.set_per_process_memory_fraction(frac)
        refused = None
        try:
            for turn in range(20):
                name = "ab"[turn % 2]
                gmr.wake(name)
                if turn == 1:
                    try:
                        gmr.wake("a")  # b is awake: a does not fit beside it
                    except gmr.GmrError as e:
                        refused = str(e)
                m, x, g, out, ref = models[name]
                g.replay()
                torch.cuda.synchronize()
                need(torch.equal(out, ref), "replay of %s after wake %d differs" % (name, turn))
                gmr.sleep(name, mode="offload")
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0)
        need(refused is not None and "needs" in refused,
             "waking both under the fraction was not refused: %s" % refused)
        gmr.wake("model")
        need(torch.equal(logits(), state["ref"]), "the first model's logits differ")
        return "20 turns, graph replays identical; second wake refused: %s" % refused[:200]

    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "sleep_wake-%s.json" % a.policy)
    with open(path, "w") as f:
        json.dump(results, f, indent=1, default=str)
    print("wrote %s; %d checks failed%s" % (path, len(failed),
                                             (": " + ", ".join(failed)) if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
