"""GPT-2 (small, random init) trained with DistributedDataParallel on every
local GPU, one process per GPU, with PyTorch's allocator or with gmr's hooks.

    torchrun --nproc_per_node=2 gpt2_ddp.py --allocator native|gmr
             [--config FILE] [--steps N] [--json OUT]

The model setup is gpt2_train.py's (same seed, deterministic kernels, eager
attention); each rank trains on its own batches (seeded by rank), gradients
are averaged by NCCL.  Per rank: the loss of every step (float and hex, for
bit-exact comparisons), the median step time after --warmup steps (CUDA
events), and the device's peak reserved/allocated (torch.cuda.max_memory_*
under native, gmr.stats(local_rank) under gmr).  Rank 0 gathers all ranks and
writes one JSON: {"allocator", "config", "world", "ranks": [{...}, ...]}.
Exits 0 with "SKIP" with fewer than two CUDA devices.
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
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--json")
    a = ap.parse_args()

    import torch

    if torch.cuda.device_count() < 2:
        print("SKIP: %d CUDA device(s), two needed" % torch.cuda.device_count())
        return 0
    rank = int(os.environ["RANK"])
    local = int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(local)
    if a.allocator == "gmr":
        import gmr

        gmr.use_in_torch(a.config)  # before the first CUDA tensor (NCCL's included)

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from transformers import GPT2Config, GPT2LMHeadModel

    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    try:
        cfg = GPT2Config(n_positions=1024, attn_implementation="eager")
    except TypeError:
        cfg = GPT2Config(n_positions=1024)
    model = DDP(GPT2LMHeadModel(cfg).cuda(local), device_ids=[local])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device="cpu").manual_seed(1234 + rank)
    batches = [torch.randint(0, cfg.vocab_size, (a.batch, a.seq), generator=gen)
               for _ in range(a.warmup + a.steps)]

    losses, times = [], []
    for i, ids in enumerate(batches):
        ids = ids.cuda(local)
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
        if i >= a.warmup:
            times.append(start.elapsed_time(end))
        print("rank %d step %2d loss %.6f %s %.2f ms" % (
            rank, i, loss, float(loss).hex(), start.elapsed_time(end)), flush=True)

    r = {"rank": rank, "device": local, "losses": losses,
         "losses_hex": [float(x).hex() for x in losses],
         "median_step_ms": statistics.median(times), "step_ms": times}
    if a.allocator == "native":
        r["peak_reserved"] = torch.cuda.max_memory_reserved(local)
        r["peak_allocated"] = torch.cuda.max_memory_allocated(local)
    else:
        import gmr

        s = gmr.stats(local)
        r["gmr_policy"] = gmr.policy(local)
        r["peak_reserved"] = s["peak_reserved_bytes"]
        r["peak_allocated"] = s["peak_allocated_bytes"]
        r["num_allocs"] = s["num_allocs"]
    every = [None] * world
    dist.all_gather_object(every, r)
    if rank == 0:
        res = {"allocator": a.allocator, "config": a.config, "world": world, "ranks": every}
        for x in every:
            print(json.dumps({k: v for k, v in x.items() if k not in ("losses", "step_ms")}))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
