"""Pipeline parallel (pp=2, 1F1B and GPipe) vs DDP vs FSDP2 on CPU processes: step time and peak memory per
process (per stage for pp), the same model and the same global batch per step.

    python benchmarks/pp_vs_fsdp.py [--num_processes 2] [--dim 512] [--depth 4] [--seq 64] [--rows 8] [--steps 5]
                                    [--microbatches 4]

The model is tp_vs_fsdp.py's plain transformer (an nn.Sequential of blocks). DDP and FSDP2 give each process `rows`
sequences; the pipeline's processes share `rows x num_processes` sequences, cut into `microbatches` micro-batches.
Accelerate cannot run this side: its pipeline training needs Megatron-LM and its own model classes. Each side runs in
fresh processes (`hasten launch`), so its peak memory is its own.
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._launch import (  # noqa: E402
    forward, hasten_command, kib, launch_all, launch_env, print_strategy_table, worker_or_parent,
)
from benchmarks.tp_vs_fsdp import _args as _tp_args, _model, measure, model_text  # noqa: E402

STRATEGIES = ("ddp", "fsdp2", "pp-1f1b", "pp-gpipe")
ACCELERATE_NOTE = "accelerate: left out: its pipeline training runs only through Megatron-LM"


def _args(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    microbatches = 4
    if "--microbatches" in argv:
        i = argv.index("--microbatches")
        microbatches = int(argv[i + 1])
        del argv[i:i + 2]
    worker = None
    for item in list(argv):
        if item.startswith("--worker="):
            worker = item.split("=", 1)[1]
            argv.remove(item)
    args = _tp_args(argv)
    args.microbatches, args.worker = microbatches, worker
    return args


def worker(args) -> None:
    import torch

    from hasten import Accelerator, ParallelismConfig
    from hasten.parallelism_config import TorchPipelineParallelConfig

    n = args.num_processes
    pipelined = args.worker.startswith("pp")
    if pipelined:
        handler = TorchPipelineParallelConfig(schedule="GPipe" if args.worker == "pp-gpipe" else "1F1B",
                                              microbatches=args.microbatches,
                                              loss_fn=lambda out, _: out.pow(2).mean())
        config = ParallelismConfig(pp_size=n, pp_handler=handler)
    else:
        config = {"ddp": ParallelismConfig(dp_replicate_size=n), "fsdp2": ParallelismConfig(dp_shard_size=n)}[args.worker]
    accelerator = Accelerator(parallelism_config=config)
    rank, is_main = accelerator.process_index, accelerator.is_main_process
    baseline = kib("VmRSS")
    model = _model(args)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    rows = args.rows * n if pipelined else args.rows
    generator = torch.Generator().manual_seed(0 if pipelined else rank)

    def step(x):
        if pipelined:
            loss = model(x, labels=torch.zeros(rows))
        else:
            loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()

    measure(args, step, rows, generator, is_main, baseline, params)


def main(argv=None) -> int:
    return worker_or_parent(_args(argv), worker, compare)


def compare(args) -> int:
    """Launch each strategy, print the table."""
    env = launch_env("HASTEN_", "ACCELERATE_", "FSDP_", "PARALLELISM_")
    results = launch_all([hasten_command(__file__, args.num_processes, [
        f"--worker={strategy}", "--microbatches", str(args.microbatches),
        *forward(args, "dim", "heads", "depth", "seq", "rows", "steps")]) for strategy in STRATEGIES], env)
    if results is None:
        return 1
    print(f"model: {model_text(args, results[0]['params'])}; global batch {args.rows * args.num_processes} x "
          f"{args.seq} tokens per step for every side; pp: {args.microbatches} micro-batches; median of "
          f"{args.steps} steps")
    print_strategy_table(results, "peak memory per process/stage (MiB)")
    print(ACCELERATE_NOTE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
