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

import os
import sys

if __package__ in (None, ""):  # run as a script, as `hasten launch` runs the workers
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._launch import (  # noqa: E402
    forward, hasten_command, kib, launch_all, launch_env, params_text, print_strategy_table, report_peaks,
    strategy_parser, timed_steps, worker_or_parent,
)

STRATEGIES = ("ddp", "fsdp2", "tp", "raw-tp")
ACCELERATE_NOTE = ("accelerate: left out: its tensor parallelism only runs transformers models loaded with "
                   "tp_plan=\"auto\" (this is a plain nn.Module)")


def _args(argv=None):
    parser = strategy_parser(__doc__.splitlines()[0], STRATEGIES, {"rows": "sequences per data-parallel process per step"},
                             num_processes=2, dim=512, heads=8, depth=4, seq=64, rows=8, steps=5)
    return parser.parse_args(argv)


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


def model_text(args, params: int) -> str:
    return (f"{args.depth} transformer blocks of width {args.dim} ({args.heads} heads) = {params_text(params)}, AdamW; "
            f"{args.num_processes} CPU processes (gloo)")


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
    baseline = kib("VmRSS")
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

    def step(x):
        backward(model(x).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()

    measure(args, step, rows, generator, is_main, baseline, params)


def measure(args, step, rows: int, generator, is_main: bool, baseline: int, params: int) -> None:
    """Time `step` on `rows` random sequences a step, report, and leave the process group (pp_vs_fsdp's too)."""
    import torch

    batches = (torch.randn(rows, args.seq, args.dim, generator=generator) for _ in range(2 + args.steps))
    step_s = timed_steps(step, batches, 2, args.steps, torch.distributed.barrier)
    report_peaks(is_main, baseline, strategy=args.worker, params=params, step_s=step_s)
    torch.distributed.destroy_process_group()


def main(argv=None) -> int:
    return worker_or_parent(_args(argv), worker, compare)


def compare(args) -> int:
    """Launch each strategy, print the table."""
    env = launch_env("HASTEN_", "ACCELERATE_", "FSDP_", "PARALLELISM_")
    results = launch_all([hasten_command(__file__, args.num_processes, ["--worker", strategy, *forward(
        args, "dim", "heads", "depth", "seq", "rows", "steps")]) for strategy in STRATEGIES], env)
    if results is None:
        return 1
    print(f"model: {model_text(args, results[0]['params'])}; global batch {args.rows * args.num_processes} x "
          f"{args.seq} tokens per step for every side; median of {args.steps} steps")
    print_strategy_table(results)
    print(ACCELERATE_NOTE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
