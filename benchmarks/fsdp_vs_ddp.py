"""FSDP2 vs DDP on CPU processes: step time and peak memory per process, side by side.

    python benchmarks/fsdp_vs_ddp.py [--num_processes 2] [--dim 768] [--depth 8] [--rows 256] [--steps 5]

The script launches itself once per strategy (`hasten launch`, so each strategy starts from a fresh process
and its peak memory is its own), then prints one table. Same model, data, AdamW optimizer and seed for both.
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a script, as `hasten launch` runs the workers
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._launch import (  # noqa: E402
    forward, hasten_command, kib, launch_all, launch_env, memory_ratio, mlp_blocks, params_text, print_strategy_table,
    report_peaks, step_ratio, strategy_parser, timed_steps, worker_or_parent,
)

STRATEGIES = ("ddp", "fsdp2")


def _args(argv=None):
    parser = strategy_parser(__doc__.splitlines()[0], STRATEGIES, num_processes=2, dim=768, depth=8, rows=256, steps=5)
    return parser.parse_args(argv)


def worker(args) -> None:
    import torch

    from hasten import Accelerator
    from hasten.config.fsdp import FullyShardedDataParallelPlugin

    plugin = None
    if args.worker == "fsdp2":
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                                transformer_cls_names_to_wrap=["Block"])
    accelerator = Accelerator(fsdp_plugin=plugin)
    baseline = kib("VmRSS")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*mlp_blocks(args.dim, args.depth))
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    generator = torch.Generator().manual_seed(accelerator.process_index)

    def step(x):
        accelerator.backward(model(x).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()

    batches = (torch.randn(args.rows, args.dim, generator=generator) for _ in range(2 + args.steps))
    step_s = timed_steps(step, batches, 2, args.steps, accelerator.wait_for_everyone)
    report_peaks(accelerator.is_main_process, baseline, strategy=args.worker, params=params, step_s=step_s)
    accelerator.end_training()


def main(argv=None) -> int:
    return worker_or_parent(_args(argv), worker, compare)


def compare(args) -> int:
    """Launch each strategy, print the table."""
    env = launch_env("HASTEN_", "ACCELERATE_", "FSDP_")
    results = launch_all([hasten_command(__file__, args.num_processes,
                                         ["--worker", strategy, *forward(args, "dim", "depth", "rows", "steps")])
                          for strategy in STRATEGIES], env)
    if results is None:
        return 1
    print(f"model: {args.depth} MLP blocks of width {args.dim} = {params_text(results[0]['params'])}, AdamW; "
          f"{args.num_processes} CPU processes (gloo), {args.rows} rows x {args.dim} per process per step; median of "
          f"{args.steps} steps")
    print_strategy_table(results, ratios=False)
    ddp, fsdp = results
    print(f"fsdp2/ddp: step time x{step_ratio(fsdp, ddp):.2f}, peak memory x{memory_ratio(fsdp, ddp):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
