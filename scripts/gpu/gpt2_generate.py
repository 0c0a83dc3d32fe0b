"""GPT-2 serving with a growing KV cache: several requests of different
prompt and output lengths, generated one token at a time (random init, no
download), so most blocks are small and the cache grows step by step.

    python3 gpt2_generate.py [--requests N] [--seed S]
    gmr-record -o traces/gpt2_generate.csv scripts/gpu/gpt2_generate.py

Each request is a batch of 1-8 sequences with a prompt of 16-512 tokens and
16-96 new tokens (greedy decoding with the model's KV cache); requests run
one after another as a simple server would.  Prints one line per request and
PyTorch's peak figures; exits 0 with "SKIP" when there is no CUDA device.
"""

import argparse
import random
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 0
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_positions=1024)
    model = GPT2LMHeadModel(cfg).cuda().half().eval()
    rng = random.Random(a.seed)
    with torch.inference_mode():
        for r in range(a.requests):
            batch = rng.choice([1, 1, 2, 4, 8])
            prompt = rng.randint(16, 512)
            new = rng.randint(16, 96)
            ids = torch.randint(0, cfg.vocab_size, (batch, prompt), device="cuda")
            out = model(input_ids=ids, use_cache=True)
            past = out.past_key_values
            tok = out.logits[:, -1:].argmax(-1)
            for _ in range(new - 1):
                out = model(input_ids=tok, past_key_values=past, use_cache=True)
                past = out.past_key_values
                tok = out.logits[:, -1:].argmax(-1)
            del out, past, tok, ids
            print("request %2d: batch %d prompt %3d new %3d" % (r, batch, prompt, new), flush=True)
    torch.cuda.synchronize()
    st = torch.cuda.memory_stats()
    print("peak allocated %d reserved %d segments %d" % (
        st["allocated_bytes.all.peak"], st["reserved_bytes.all.peak"], st["segment.all.peak"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
