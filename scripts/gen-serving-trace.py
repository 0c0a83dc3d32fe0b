#!/usr/bin/env python3
"""gen-serving-trace.py: write a serving-like allocation trace (RMM's layout).

    scripts/gen-serving-trace.py OUT.csv [--requests N] [--seed S] [--warmup W]

The allocation pattern of GPT-2 small (12 layers, 768 wide, fp16) serving
requests one after another with Hugging Face's KV cache, as recorded in
traces/gpt2_generate.csv: each request is a batch of 1-8 sequences, a prompt
of 16-700 tokens and 16-200 new tokens.  The prefill allocates the layers'
activations for batch x prompt tokens; every decode step then, per layer,
allocates the step's small activations, grows the layer's K and V by one
token (torch.cat: the new tensor is allocated while the old is live, then
the old one is freed) and frees the step's activations; the logits follow.
So the cache's lengths never repeat.  Prints, on standard output, the
tokens generated and the event index after the first W requests (the
warm-up), with the tokens generated after it, for maps per token.  The same
arguments give the same file.
"""
import argparse
import random
import sys

LAYERS, WIDTH, VOCAB, FP16 = 12, 768, 50257, 2


class Trace:
    def __init__(self, out):
        self.out, self.n, self.next_ptr, self.live = out, 0, 0x7F0000000000, {}

    def alloc(self, size):
        ptr = self.next_ptr
        self.next_ptr += (size + 511) // 512 * 512 + 512
        self.live[ptr] = size
        self.out.write("0,%d,allocate,0x%x,%d,0\n" % (self.n, ptr, size))
        self.n += 1
        return ptr

    def free(self, ptr):
        size = self.live.pop(ptr)
        self.out.write("0,%d,free,0x%x,%d,0\n" % (self.n, ptr, size))
        self.n += 1


def layer(t, b, n, kv, i, new):
    """One layer over n new tokens of b sequences; kv[i] = (K, V, length)."""
    ln = t.alloc(b * n * WIDTH * FP16)
    qkv = t.alloc(b * n * 3 * WIDTH * FP16)
    k, v, length = kv[i]
    length += n
    kb = b * length * WIDTH * FP16
    if new:
        nk, nv = t.alloc(kb), t.alloc(kb)
    else:
        nk = t.alloc(kb)  # torch.cat(past_k, k)
        t.free(k)
        nv = t.alloc(kb)
        t.free(v)
    kv[i] = (nk, nv, length)
    att = t.alloc(b * n * WIDTH * FP16)
    t.free(qkv)
    t.free(ln)
    mlp = t.alloc(b * n * 4 * WIDTH * FP16)
    act = t.alloc(b * n * 4 * WIDTH * FP16)
    t.free(mlp)
    out = t.alloc(b * n * WIDTH * FP16)
    t.free(act)
    t.free(att)
    t.free(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--seed", type=int, default=31)
    ap.add_argument("--warmup", type=int, default=4, help="requests counted as warm-up")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    out = open(a.out, "w", buffering=1 << 20)
    out.write("Thread,Time,Action,Pointer,Size,Stream\n")
    t = Trace(out)
    weights = [t.alloc(VOCAB * WIDTH * FP16), t.alloc(1024 * WIDTH * FP16)]
    weights += [t.alloc(12 * WIDTH * WIDTH * FP16) for _ in range(LAYERS)]
    tokens = tokens_after = 0
    warm_event = 0
    for r in range(a.requests):
        if r == a.warmup:
            warm_event = t.n
        b, p, o = rng.randint(1, 8), rng.randint(16, 700), rng.randint(16, 200)
        ids = t.alloc(b * p * 8)
        kv = [(None, None, 0)] * LAYERS
        n, new = p, True
        for step in range(o):
            h = t.alloc(b * n * WIDTH * FP16)
            for i in range(LAYERS):
                layer(t, b, n, kv, i, new)
            logits = t.alloc(b * VOCAB * FP16)  # the last position only
            t.free(h)
            tok = t.alloc(b * 8)
            t.free(logits)
            t.free(ids)
            ids = tok
            n, new = 1, False
            tokens += b
            if r >= a.warmup:
                tokens_after += b
        t.free(ids)
        for k, v, _ in kv:
            t.free(k)
            t.free(v)
    for w in weights:
        t.free(w)
    out.close()
    print("events %d tokens %d warmup_event %d tokens_after_warmup %d" %
          (t.n, tokens, warm_event, tokens_after))


if __name__ == "__main__":
    sys.exit(main())
