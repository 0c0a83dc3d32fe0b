"""GPT-2 (small, random init, no download) trained for a few steps, with
PyTorch's own allocator or with gmr (gmr.use_in_torch), deterministically.

    python3 gpt2_train.py --allocator native|gmr [--config FILE] [--steps N]
                          [--json OUT] [--trace FILE]

Prints one line per step with the loss as a float and in hex (bit-exact
comparisons), then a JSON summary: losses, median step time (CUDA events
around each step, after --warmup steps), and the allocator's figures (peak
reserved/allocated; gmr's stats under gmr).  --trace sets GMR_TRACE so the
run's allocations can be replayed on the simulator (replay_check.py).
Exits 0 with "SKIP" when there is no CUDA device.
"""

import argparse
import json
import os
import statistics
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--allocator", choices=["native", "gmr"], required=True)
    ap.add_argument("--config", help="gmr YAML (GMR_CONFIG)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--json")
    ap.add_argument("--trace")
    a = ap.parse_args()

    if a.trace:
        os.environ["GMR_TRACE"] = a.trace
    import torch

    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 0
    if a.allocator == "gmr":
        import gmr

        gmr.use_in_torch(a.config)

    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # Deterministic attention: the eager implementation, or SDPA's math kernel.
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    try:
        cfg = GPT2Config(n_positions=1024, attn_implementation="eager")
    except TypeError:
        cfg = GPT2Config(n_positions=1024)  # GPT-2 small: 12 layers, 768 wide
    model = GPT2LMHeadModel(cfg).cuda()
    print("GPT-2: %d parameters, attention %s" % (
        sum(p.numel() for p in model.parameters()), getattr(cfg, "_attn_implementation", "?")))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device="cpu").manual_seed(1234)
    batches = [torch.randint(0, cfg.vocab_size, (a.batch, a.seq), generator=gen)
               for _ in range(a.warmup + a.steps)]

    def gmr_maps():
        # Page maps so far under the stitch policy (absent under others).
        if a.allocator != "gmr":
            return None
        import gmr

        return gmr.stats(0).get("stitch.map_calls")

    losses, times, maps_per_step = [], [], []
    for i, ids in enumerate(batches):
        maps_before = gmr_maps()
        ids = ids.cuda()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        end.record()
        end.synchronize()
        loss = out.loss.item()
        losses.append(loss)
        if maps_before is not None:
            maps_per_step.append(gmr_maps() - maps_before)
        if i >= a.warmup:
            times.append(start.elapsed_time(end))
        print("step %2d loss %.6f %s %.2f ms" % (i, loss, float(loss).hex(), start.elapsed_time(end)),
              flush=True)

    res = {"allocator": a.allocator, "config": a.config, "losses_hex": [float(x).hex() for x in losses],
           "losses": losses, "median_step_ms": statistics.median(times), "step_ms": times}
    if a.allocator == "native":
        res["peak_reserved"] = torch.cuda.max_memory_reserved()
        res["peak_allocated"] = torch.cuda.max_memory_allocated()
        res["peak_requested"] = torch.cuda.memory_stats().get("requested_bytes.all.peak", 0)
        res["num_alloc_retries"] = torch.cuda.memory_stats()["num_alloc_retries"]
        res["alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    else:
        import gmr

        s = gmr.stats(0)
        res["gmr_policy"] = gmr.policy(0)
        res["peak_reserved"] = s["peak_reserved_bytes"]
        res["peak_allocated"] = s["peak_allocated_bytes"]
        res["peak_requested"] = s["peak_requested_bytes"]
        res["gmr_stats"] = s
        if maps_per_step:
            # The stitch policy: device memory mapped at the peak is its pages
            # (peak_reserved_bytes); map calls per step, and after warm-up.
            res["map_calls_per_step"] = maps_per_step
            res["map_calls_per_step_after_warmup"] = maps_per_step[a.warmup:]
            res["peak_reserved_over_requested"] = s["peak_reserved_bytes"] / s["peak_requested_bytes"]
            res["stitch_map_ms"] = s.get("stitch.map_ns", 0) / 1e6
    print(json.dumps({k: v for k, v in res.items()
                      if k not in ("gmr_stats", "step_ms", "map_calls_per_step")}))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
