"""snapshot_record.py: a real PyTorch memory snapshot, and PyTorch's own
figures for the same run, for gmr-compare to replay (snapshot_compare.sh).

    python3 snapshot_record.py OUT.pickle OUT.json [--steps N]

GPT-2 small (random init, no download), AdamW, batch 8 x 512 tokens, on
PyTorch's own caching allocator, with the memory history recorded from
before the model is built (torch.cuda.memory._record_memory_history,
max_entries 10,000,000, Python stacks, so allocations carry their frames).
After the steps: memory_stats() (reserved_bytes.all.peak,
requested_bytes.all.peak, segment counts) into OUT.json, and
_dump_snapshot(OUT.pickle).  Exits 0 with "SKIP" without a CUDA device.
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pickle")
    ap.add_argument("json")
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 0
    torch.cuda.memory._record_memory_history(max_entries=10_000_000, stacks="python")
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(a.steps):
        x = torch.randint(0, 50257, (8, 512), device="cuda")
        loss = model(x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    s = torch.cuda.memory_stats()
    figures = {k: s[k] for k in ("reserved_bytes.all.peak", "requested_bytes.all.peak",
                                 "allocated_bytes.all.peak", "segment.all.peak",
                                 "num_alloc_retries", "num_ooms")}
    torch.cuda.memory._dump_snapshot(a.pickle)
    torch.cuda.memory._record_memory_history(enabled=None)
    with open(a.json, "w") as f:
        json.dump(figures, f, indent=1)
    print("snapshot_record: %s" % json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
