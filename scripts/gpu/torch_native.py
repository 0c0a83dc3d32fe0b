"""torch.cuda's memory API under gmr's native PyTorch adapter, item by item.

    python3 scripts/gpu/torch_native.py --policy caching|bfc|stitch|direct|torch --out DIR

--policy torch runs PyTorch's own allocator, for comparison; the others
install gmr (gmr.use_in_torch, the native adapter) with config/pytorch.yaml,
tf-growth.yaml, stitch.yaml or direct.yaml.  Each item prints one line
`CHECK <name> ok` or `CHECK <name> FAIL <detail>`, in its own try, so one
failure hides nothing else; DIR gets torch_native-<policy>.json (the figures:
memory_allocated/reserved and their peaks, memory_stats(), memory_summary(),
the losses of a small GPT-2 trained with fixed seeds, the host cost of
torch.empty + del) and the snapshot pickle.  Exit status: 1 when a check
failed; 0 with "SKIP" when there is no torch or no CUDA device.
"""

import argparse
import json
import os
import pickle
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = {"caching": "pytorch.yaml", "bfc": "tf-growth.yaml", "stitch": "stitch.yaml",
           "direct": "direct.yaml"}
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

results = {"checks": {}, "stats_after": {}}
failed = []
# memory_stats() after each check, so two runs can be compared check by check.
STATS_AFTER = ("allocation.all.allocated", "allocated_bytes.all.allocated",
               "allocated_bytes.all.current", "reserved_bytes.all.current",
               "num_device_alloc", "num_device_free", "num_alloc_retries", "num_ooms")


def _stats_after(name):
    try:
        import torch

        st = torch.cuda.memory_stats()
        results["stats_after"][name] = {k: st.get(k) for k in STATS_AFTER}
    except Exception as e:  # noqa: BLE001: a figure, not a check
        results["stats_after"][name] = {"error": str(e)[:200]}


def check(name):
    """Run fn as check `name`: ok when it returns (a detail string, or
    None), FAIL with the exception's text otherwise."""
    def wrap(fn):
        t0 = time.time()
        try:
            detail = fn()
            line = "CHECK %s ok%s" % (name, (" " + detail) if detail else "")
            results["checks"][name] = {"ok": True, "detail": detail,
                                       "seconds": round(time.time() - t0, 3)}
        except Exception as e:  # noqa: BLE001: every failure is a result
            msg = ("%s: %s" % (type(e).__name__, e)).replace("\n", " | ")[:600]
            line = "CHECK %s FAIL %s" % (name, msg)
            results["checks"][name] = {"ok": False, "detail": msg,
                                       "traceback": traceback.format_exc()[-4000:]}
            failed.append(name)
        _stats_after(name)
        print(line, flush=True)
        return fn
    return wrap


def need(cond, what):
    if not cond:
        raise AssertionError(what)


def install(policy):
    """Install gmr for `policy` (nothing for torch); returns a description."""
    if policy == "torch":
        return "PyTorch's own allocator"
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import gmr
    from gmr import _torch

    os.environ["GMR_TORCH_ADAPTER"] = "native"  # a build failure is a failure here
    gmr.use_in_torch(os.path.join(ROOT, "config", CONFIGS[policy]))
    need(_torch.installed(), "the native adapter is not torch's allocator")
    return "gmr %s (%s), adapter %s" % (gmr.policy(0), CONFIGS[policy], _torch._native.path)


def _ipc_child(policy, q_in, q_out):
    """The child of the IPC check: under gmr too when the parent is."""
    try:
        if policy != "torch":
            install(policy)
        t = q_in.get()
        q_out.put(("ok", float(t.double().sum().item()), int(t.data_ptr())))
    except Exception as e:  # noqa: BLE001
        q_out.put(("error", "%s: %s" % (type(e).__name__, e), 0))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", choices=sorted(CONFIGS) + ["torch"], required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=6)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    try:
        import torch
    except ImportError:
        print("SKIP: no torch")
        return 0
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 0
    results["policy"] = a.policy
    results["torch"] = torch.__version__
    t0 = time.time()
    try:
        results["allocator"] = install(a.policy)
    except Exception as e:  # noqa: BLE001
        print("CHECK install FAIL %s: %s" % (type(e).__name__, str(e).replace("\n", " | ")))
        results["checks"]["install"] = {"ok": False, "detail": str(e)}
        _write(a)
        return 1
    print("CHECK install ok %s (%.1f s)" % (results["allocator"], time.time() - t0), flush=True)
    import torch.nn as nn

    dev = torch.device("cuda")
    total = torch.cuda.get_device_properties(0).total_memory

    @check("gpt2-train")
    def _gpt2():
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            cfg = GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=256, vocab_size=8192,
                             attn_implementation="eager")
        except TypeError:
            cfg = GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=256, vocab_size=8192)
        model = GPT2LMHeadModel(cfg).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        gen = torch.Generator().manual_seed(1234)
        losses = []
        for _ in range(a.steps):
            ids = torch.randint(0, cfg.vocab_size, (8, 256), generator=gen).to(dev)
            loss = model(ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.item()))
        torch.cuda.synchronize()
        results["losses"] = losses
        results["losses_hex"] = [x.hex() for x in losses]
        results["memory_allocated"] = torch.cuda.memory_allocated()
        results["max_memory_allocated"] = torch.cuda.max_memory_allocated()
        results["memory_reserved"] = torch.cuda.memory_reserved()
        results["max_memory_reserved"] = torch.cuda.max_memory_reserved()
        results["memory_stats"] = dict(torch.cuda.memory_stats())
        results["memory_summary"] = torch.cuda.memory_summary()
        need(results["max_memory_allocated"] > 0, "max_memory_allocated() is 0")
        need(results["memory_reserved"] >= results["memory_allocated"], "reserved < allocated")
        del model, opt
        return "losses %s, peak allocated %d" % (
            ["%.4f" % x for x in losses], results["max_memory_allocated"])

    @check("reset-peak")
    def _reset_peak():
        x = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
        del x
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.reset_accumulated_memory_stats()
        peak = torch.cuda.max_memory_allocated()
        need(peak == torch.cuda.memory_allocated(), "peak %d != current %d after the reset"
             % (peak, torch.cuda.memory_allocated()))
        return "peak %d" % peak

    @check("memory-history-snapshot")
    def _history():
        from torch.cuda import _memory_viz

        torch.cuda.memory._record_memory_history(max_entries=100000)
        m = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to(dev)
        y = m(torch.randn(64, 512, device=dev)).sum()
        y.backward()
        big = torch.empty(32 << 20, dtype=torch.uint8, device=dev)
        del big
        snap = torch.cuda.memory._snapshot()
        path = os.path.join(a.out, "snapshot-%s.pickle" % a.policy)
        torch.cuda.memory._dump_snapshot(path)
        torch.cuda.memory._record_memory_history(enabled=None)
        with open(path, "rb") as f:
            loaded = pickle.load(f)
        need(loaded["segments"], "no segments in the snapshot")
        tr = loaded["device_traces"][0]
        need(tr, "no device trace")
        actions = sorted({e["action"] for e in tr})
        framed = [e for e in tr if e.get("frames")]
        need(framed, "no trace entry has frames")
        need(any("alloc" == e["action"] for e in framed), "no alloc entry with frames")
        blocks_framed = sum(1 for s in loaded["segments"] for b in s["blocks"] if b.get("frames"))
        segsum = _memory_viz.segsum(loaded)
        trace_txt = _memory_viz.trace(loaded)
        need(segsum and trace_txt, "memory_viz gave no text")
        results["snapshot"] = {"segments": len(loaded["segments"]), "trace_entries": len(tr),
                               "actions": actions, "framed_entries": len(framed),
                               "framed_blocks": blocks_framed}
        del m, y, snap
        return "%d segments, %d trace entries %s, %d with frames, %d blocks with frames" % (
            len(loaded["segments"]), len(tr), actions, len(framed), blocks_framed)

    @check("cuda-graph")
    def _graph():
        torch.manual_seed(1)
        m = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).to(dev)
        static_in = torch.randn(32, 256, device=dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(s):
            for _ in range(3):
                m(static_in)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(g):
            static_out = m(static_in)
        eager = [torch.full((1024,), 7.0, device=dev) for _ in range(300)]
        eager += [torch.full((1 << 18,), 7.0, device=dev) for _ in range(100)]
        worst = 0.0
        for i in range(5):
            x = torch.randn(32, 256, device=dev)
            static_in.copy_(x)
            g.replay()
            torch.cuda.synchronize()
            with torch.no_grad():
                ref = m(x)
            worst = max(worst, float((static_out - ref).abs().max()))
        need(worst < 1e-4, "replay differs from eager by %g" % worst)
        bad = sum(1 for t in eager if not bool((t == 7.0).all()))
        need(bad == 0, "%d of 400 eager tensors lost their value after replays" % bad)
        segs = [sg for sg in torch.cuda.memory._snapshot()["segments"]
                if tuple(sg.get("segment_pool_id", (0, 0))) == tuple(g.pool())]
        inside = 0
        for t in eager:
            p = t.data_ptr()
            inside += any(sg["address"] <= p < sg["address"] + sg["total_size"] for sg in segs)
        need(inside == 0, "%d eager tensors lie in the graph's pool" % inside)
        del g, static_out, eager
        return "max |replay - eager| %g; 400 eager tensors intact; %d pool segments" % (
            worst, len(segs))

    @check("cuda-graph-shared-pool")
    def _graph_shared():
        # Two graphs in one pool (as cudagraph trees record them); the first
        # is deleted and the cache emptied, eager tensors take whatever was
        # given back, and the second must still replay into valid memory.
        torch.manual_seed(3)
        m = nn.Sequential(nn.Linear(256, 2048), nn.GELU(), nn.Linear(2048, 256)).to(dev)
        xin = torch.randn(64, 256, device=dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(s):
            for _ in range(3):
                m(xin)
        torch.cuda.current_stream().wait_stream(s)
        g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(g1):
            out1 = m(xin)
        with torch.no_grad(), torch.cuda.graph(g2, pool=g1.pool()):
            out2 = m(xin * 2)
        del g1, out1
        torch.cuda.empty_cache()
        fill = [torch.full((1 << 20,), 3.0, device=dev) for _ in range(64)]
        worst = 0.0
        for _ in range(5):
            x = torch.randn(64, 256, device=dev)
            xin.copy_(x)
            g2.replay()
            torch.cuda.synchronize()
            with torch.no_grad():
                ref = m(x * 2)
            worst = max(worst, float((out2 - ref).abs().max()))
        need(worst < 1e-4, "the second graph's replay differs from eager by %g" % worst)
        bad = sum(1 for t in fill if not bool((t == 3.0).all()))
        need(bad == 0, "%d of 64 eager tensors were overwritten by the replays" % bad)
        del g2, out2, fill
        return "max |replay - eager| %g after the first graph was deleted; eager tensors intact" % worst

    @check("compile-reduce-overhead")
    def _compile():
        torch.manual_seed(2)
        m = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 64)).to(dev).eval()
        cm = torch.compile(m, mode="reduce-overhead")
        worst = 0.0
        with torch.no_grad():
            for i in range(6):
                x = torch.randn(16, 128, device=dev)
                out = cm(x).clone()
                ref = m(x)
                worst = max(worst, float((out - ref).abs().max()))
        need(worst < 1e-3, "compiled output differs from eager by %g" % worst)
        return "max |compiled - eager| %g over 6 calls" % worst

    @check("cudnn-benchmark")
    def _cudnn():
        torch.backends.cudnn.benchmark = True
        try:
            net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                                nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
                                nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)).to(dev)
            opt = torch.optim.SGD(net.parameters(), lr=0.1)
            for _ in range(3):
                x = torch.randn(16, 3, 64, 64, device=dev)
                loss = nn.functional.cross_entropy(net(x), torch.randint(0, 10, (16,),
                                                                        device=dev))
                loss.backward()
                opt.step()
                opt.zero_grad()
            torch.cuda.synchronize()
        finally:
            torch.backends.cudnn.benchmark = False
        return "loss %.4f" % float(loss)

    @check("memory-fraction")
    def _fraction():
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(0.5)
        try:
            got = torch.cuda.get_per_process_memory_fraction()
            need(abs(got - 0.5) < 1e-9, "get_per_process_memory_fraction() is %r" % got)
            ok_small = torch.empty(int(total * 0.1), dtype=torch.uint8, device=dev)
            del ok_small
            try:
                x = torch.empty(int(total * 0.6), dtype=torch.uint8, device=dev)
                del x
                raise AssertionError("an allocation of 0.6 of the device passed the fraction 0.5")
            except torch.OutOfMemoryError as e:
                msg = str(e).splitlines()[0][:200]
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0)
            torch.cuda.empty_cache()
        return "OutOfMemoryError: %s" % msg

    @check("mempool")
    def _mempool():
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            t = torch.randn(1 << 20, device=dev)
        uses = pool.use_count()
        segs = pool.snapshot()
        p = t.data_ptr()
        need(any(sg["address"] <= p < sg["address"] + sg["total_size"] for sg in segs),
             "the tensor is in none of the pool's %d segments" % len(segs))
        u = torch.randn(1 << 20, device=dev)
        need(not any(sg["address"] <= u.data_ptr() < sg["address"] + sg["total_size"]
                     for sg in segs), "an allocation outside use_mem_pool landed in the pool")
        s = float(t.sum())
        del t, u, pool
        torch.cuda.empty_cache()
        return "use_count %d, %d pool segments, sum %.3f" % (uses, len(segs), s)

    @check("ipc-spawn")
    def _ipc():
        import torch.multiprocessing as mp
        from multiprocessing.reduction import ForkingPickler

        t = torch.arange(1 << 16, dtype=torch.float32, device=dev)
        want = float(t.double().sum().item())
        try:  # what Queue.put does in its feeder thread, here where it can be seen
            ForkingPickler.dumps(t)
        except RuntimeError as e:
            # caching and bfc share cudaMalloc ranges; a policy that maps pages
            # must refuse with gmr's sentence (issue: "elsewhere it refuses clearly")
            need(a.policy not in ("torch", "caching", "bfc"), "refused: %s" % e)
            need("cannot be shared with another process" in str(e), "unclear refusal: %s" % e)
            return "refused clearly: %s" % str(e).split("\n")[0][:240]
        ctx = mp.get_context("spawn")
        q_in, q_out = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=_ipc_child, args=(a.policy, q_in, q_out))
        p.start()
        try:
            q_in.put(t)
            status, value, _ = q_out.get(timeout=180)
        finally:
            p.join(60)
            if p.is_alive():
                p.kill()
        need(status == "ok", "child: %s" % value)
        need(value == want, "child read sum %r, want %r" % (value, want))
        return "child read the tensor (sum %.0f)" % value

    @check("hf-trainer")
    def _hf():
        from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

        torch.manual_seed(3)
        model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=64, n_head=2, n_positions=64,
                                           vocab_size=512))
        data = [{"input_ids": torch.randint(0, 512, (32,)), "labels": None} for _ in range(16)]
        for d in data:
            d["labels"] = d["input_ids"].clone()
        with tempfile.TemporaryDirectory() as tmp:
            args = TrainingArguments(output_dir=tmp, max_steps=4, per_device_train_batch_size=4,
                                     skip_memory_metrics=False, report_to=[],
                                     save_strategy="no", logging_steps=1,
                                     disable_tqdm=True)
            out = Trainer(model=model, args=args, train_dataset=data).train()
        mem = {k: v for k, v in out.metrics.items() if "mem" in k}
        need(any("gpu" in k for k in mem), "no GPU memory metric in %s" % sorted(out.metrics))
        results["hf_memory_metrics"] = mem
        return "%s" % mem

    @check("lightning-device-stats")
    def _lightning():
        try:
            import lightning.pytorch as pl
            from lightning.pytorch.callbacks import DeviceStatsMonitor
            from lightning.pytorch.loggers import CSVLogger
        except ImportError:
            import pytorch_lightning as pl
            from pytorch_lightning.callbacks import DeviceStatsMonitor
            from pytorch_lightning.loggers import CSVLogger

        class Tiny(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.l = nn.Linear(32, 1)

            def training_step(self, batch, i):
                x, y = batch
                return nn.functional.mse_loss(self.l(x), y)

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.01)

        ds = torch.utils.data.TensorDataset(torch.randn(64, 32), torch.randn(64, 1))
        with tempfile.TemporaryDirectory() as tmp:
            logger = CSVLogger(tmp)
            tr = pl.Trainer(max_steps=4, accelerator="gpu", devices=1,
                            callbacks=[DeviceStatsMonitor()], logger=logger,
                            enable_checkpointing=False, enable_progress_bar=False,
                            log_every_n_steps=1, enable_model_summary=False)
            tr.fit(Tiny(), torch.utils.data.DataLoader(ds, batch_size=8))
            logger.save()
            csvs = [os.path.join(r, f) for r, _, fs in os.walk(tmp) for f in fs
                    if f.endswith(".csv")]
            header = open(csvs[0]).readline() if csvs else ""
        need("allocated_bytes" in header or "memory" in header,
             "DeviceStatsMonitor logged no memory statistic: %s" % header[:300])
        return "%d columns logged" % header.count(",")

    @check("host-cost")
    def _host():
        n = 20000
        for _ in range(1000):
            del_me = torch.empty(1 << 20, dtype=torch.uint8, device=dev)
            del del_me
        t0 = time.perf_counter()
        for _ in range(n):
            x = torch.empty(1 << 20, dtype=torch.uint8, device=dev)
            del x
        us = (time.perf_counter() - t0) / n * 1e6
        results["empty_del_us"] = us
        return "torch.empty(1 MiB) + del: %.3f us" % us

    @check("stats-after")
    def _after():
        st = torch.cuda.memory_stats()
        need("allocated_bytes.all.current" in st, "memory_stats() has no allocated_bytes")
        results["memory_stats_end"] = dict(st)
        return "%d keys" % len(st)

    _write(a)
    print("%d checks, %d failed%s" % (len(results["checks"]), len(failed),
                                      (": " + ", ".join(failed)) if failed else ""))
    return 1 if failed else 0


def _write(a):
    path = os.path.join(a.out, "torch_native-%s.json" % a.policy)
    with open(path, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True, default=str)
    print("wrote %s" % path)


if __name__ == "__main__":
    sys.exit(main())
