"""Serving throughput under an allocator: GPT-2 small generating with its KV
cache, lengths that never repeat (issue "Stitch for serving").

    python3 serve_bench.py --allocator torch|caching|stitch [--requests 12]
        [--warmup 2] [--seed 11] [--json FILE]

Random initialization (no download), fp16, greedy decoding written out as a
loop over the model with `past_key_values`, so every step grows the cache by
one token.  Each request is a batch of 1-8 sequences, a prompt of 16-700
tokens and 16-200 new tokens, drawn from --seed, so every run of every
allocator serves the same requests.  The first --warmup requests warm up
(kernels, the allocator's cache) and are left out of the figures: tokens/s
over the rest (generated tokens, batch included), peak reserved / peak
allocated, and under gmr the device calls per generated token
(gmr.stats()'s device_allocs, which counts reservations and page maps).
One process per allocator: run it once per allocator, interleaved, and
compare the medians.  Exits 0 with "SKIP" when there is no CUDA device.
"""

import argparse
import json
import os
import random
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = {"caching": "pytorch.yaml", "stitch": "stitch.yaml"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--allocator", choices=["torch"] + sorted(CONFIGS), required=True)
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--json")
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 0
    gmr = None
    if a.allocator != "torch":
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import gmr

        gmr.use_in_torch(os.path.join(ROOT, "config", CONFIGS[a.allocator]))
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_positions=1024)
    model = GPT2LMHeadModel(cfg).cuda().half().eval()
    rng = random.Random(a.seed)
    reqs = [(rng.randint(1, 8), rng.randint(16, 700), rng.randint(16, 200))
            for _ in range(a.requests)]
    tokens = 0
    t_start = None
    calls0 = 0
    with torch.inference_mode():
        for r, (batch, prompt, new) in enumerate(reqs):
            if r == a.warmup:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                calls0 = gmr.stats(0)["device_allocs"] if gmr else 0
                t_start = time.perf_counter()
            ids = torch.randint(0, cfg.vocab_size, (batch, prompt), device="cuda")
            out = model(input_ids=ids, use_cache=True)
            past = out.past_key_values
            tok = out.logits[:, -1:].argmax(-1)
            for _ in range(new - 1):
                out = model(input_ids=tok, past_key_values=past, use_cache=True)
                past = out.past_key_values
                tok = out.logits[:, -1:].argmax(-1)
            last = int(tok[0, 0])
            del out, past, tok, ids
            if r >= a.warmup:
                tokens += batch * new
            print("request %2d: batch %d prompt %3d new %3d last token %d" % (
                r, batch, prompt, new, last), flush=True)
    torch.cuda.synchronize()
    secs = time.perf_counter() - t_start
    st = torch.cuda.memory_stats()
    res = {
        "allocator": a.allocator,
        "requests": a.requests, "warmup": a.warmup, "seed": a.seed,
        "generated_tokens": tokens, "seconds": secs, "tokens_per_s": tokens / secs,
        "peak_allocated": st["allocated_bytes.all.peak"],
        "peak_reserved": st["reserved_bytes.all.peak"],
        "peak_ratio": st["reserved_bytes.all.peak"] / max(1, st["allocated_bytes.all.peak"]),
    }
    if gmr:
        g = gmr.stats(0)
        res["device_calls_per_token"] = (g["device_allocs"] - calls0) / max(1, tokens)
        res["gmr_device_allocs"] = g["device_allocs"]
    print("RESULT " + json.dumps(res), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
