"""Tensor parallel (TP=2) vs FSDP2 vs DDP on CPU processes: step time and peak memory per process, side by side.

    python benchmarks/tp_vs_fsdp.py [--num_processes 2] [--dim 512] [--depth 4] [--seq 64] [--rows 8] [--steps 5]

One plain PyTorch transformer (attention q/k/v/o + MLP blocks, no tp_plan attribute) and the same global batch per
step for every side: DDP and FSDP2 give each process `rows` sequences, TP gives both processes of its group the
same `rows x num_processes` sequences. Sides: hasten DDP, hasten FSDP2, hasten TP (the automatic plan), and raw
torch TP (parallelize_module by hand with the same plan, no hasten). Accelerate cannot run TP on this model: its
tensor parallelism needs a transformers model loaded with tp_plan="auto". Each side runs in fresh processes
(`hasten launch`), so its peak memory is its own.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

STRATEGIES = ("ddp", "fsdp2", "tp", "raw-tp")
ACCELERATE_NOTE = ("accelerate: left out: its tensor parallelism only runs transformers models loaded with "
                   "tp_plan=\"auto\" (this is a plain nn.Module)")


def _args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_processes", type=int, default=2)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--rows", type=int, default=8, help="sequences per data-parallel process per step")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (after 2 warm-up steps)")
    parser.add_argument("--worker", choices=STRATEGIES, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _model(args):
    import torch
    import torch.nn.functional as F

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.n_heads = args.heads
            self.q_proj, self.k_proj, self.v_proj, self.o_proj = (torch.nn.Linear(args.dim, args.dim) for _ in range(4))

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = (p(x).view(b, t, self.n_heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
            return self.o_proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1))

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = torch.nn.LayerNorm(args.dim), torch.nn.LayerNorm(args.dim)
            self.attn = Attention()
            self.up, self.down = torch.nn.Linear(args.dim, 4 * args.dim), torch.nn.Linear(4 * args.dim, args.dim)

        def forward(self, x):
            x = x + self.attn(self.norm1(x))
            return x + self.down(F.gelu(self.up(self.norm2(x))))

    torch.manual_seed(0)
    return torch.nn.Sequential(*[Block() for _ in range(args.depth)])


def worker(args) -> None:
    import torch

    from hasten import Accelerator, ParallelismConfig

    n = args.num_processes
    if args.worker == "raw-tp":
        torch.distributed.init_process_group("gloo")
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (n,), mesh_dim_names=("tp",))
        rank, is_main = torch.distributed.get_rank(), torch.distributed.get_rank() == 0
    else:
        config = {"ddp": ParallelismConfig(dp_replicate_size=n), "fsdp2": ParallelismConfig(dp_shard_size=n),
                  "tp": ParallelismConfig(tp_size=n)}[args.worker]
        accelerator = Accelerator(parallelism_config=config)
        rank, is_main = accelerator.process_index, accelerator.is_main_process
    baseline = _kib("VmRSS")
    model = _model(args)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if args.worker == "raw-tp":
        for block in model:
            parallelize_module(block, mesh, {"attn.q_proj": ColwiseParallel(), "attn.k_proj": ColwiseParallel(),
                                             "attn.v_proj": ColwiseParallel(), "attn.o_proj": RowwiseParallel(),
                                             "up": ColwiseParallel(), "down": RowwiseParallel()})
            block.attn.n_heads //= n
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)  # raw torch: after splitting
        backward = torch.Tensor.backward
    else:
        model, optimizer = accelerator.prepare(model, optimizer)
        backward = accelerator.backward
    shares_batch = args.worker in ("tp", "raw-tp")
    rows = args.rows * n if shares_batch else args.rows
    generator = torch.Generator().manual_seed(0 if shares_batch else rank)
    times = []
    for step in range(2 + args.steps):
        x = torch.randn(rows, args.seq, args.dim, generator=generator)
        torch.distributed.barrier()
        start = time.perf_counter()
        loss = model(x).pow(2).mean()
        backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        torch.distributed.barrier()
        if step >= 2:
            times.append(time.perf_counter() - start)
    peak = _kib("VmHWM") - baseline
    peaks = [None] * n
    torch.distributed.all_gather_object(peaks, peak)
    if is_main:
        print("RESULT " + json.dumps({"strategy": args.worker, "params": params, "step_s": sorted(times)[len(times) // 2],
                                      "peak_mib": [p / 1024 for p in peaks]}))
    torch.distributed.destroy_process_group()


def main(argv=None) -> int:
    args = _args(argv)
    if args.worker:
        worker(args)
        return 0
    results = []
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HASTEN_", "ACCELERATE_", "FSDP_", "PARALLELISM_"))}
    for strategy in STRATEGIES:
        command = [sys.executable, "-m", "hasten", "launch", "--num_processes", str(args.num_processes), __file__,
                   "--worker", strategy, *(f"--{k}={getattr(args, k)}" for k in ("dim", "heads", "depth", "seq",
                                                                                  "rows", "steps"))]
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
            return 1
        results.append(json.loads(lines[0][len("RESULT "):]))
    params = results[0]["params"]
    print(f"model: {args.depth} transformer blocks of width {args.dim} ({args.heads} heads) = {params / 1e6:.1f}M "
          f"parameters ({params * 4 / 2**20:.0f} MiB fp32), AdamW; {args.num_processes} CPU processes (gloo); global "
          f"batch {args.rows * args.num_processes} x {args.seq} tokens per step for every side; median of "
          f"{args.steps} steps")
    print(f"{'strategy':<10}{'step time (s)':>15}{'x ddp':>8}{'peak memory per process (MiB)':>34}{'x ddp':>8}")
    ddp = results[0]
    for r in results:
        peaks = " / ".join(f"{p:.0f}" for p in r["peak_mib"])
        print(f"{r['strategy']:<10}{r['step_s']:>15.3f}{r['step_s'] / ddp['step_s']:>8.2f}{peaks:>34}"
              f"{max(r['peak_mib']) / max(ddp['peak_mib']):>8.2f}")
    print(ACCELERATE_NOTE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
