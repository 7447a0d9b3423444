"""DeepSpeed ZeRO-2/3 vs DDP and FSDP2 on CPU processes, and hasten vs Accelerate driving the same DeepSpeed
config: step time and peak memory per process, side by side in one run.

    python -m benchmarks.deepspeed_vs_ddp [--num_processes 2] [--dim 512] [--depth 6] [--rows 64] [--steps 5]

Each side starts in fresh processes (`hasten launch`, or `accelerate launch --use_deepspeed` for Accelerate), so
its peak memory is its own. Same model, data, AdamW optimizer, seed and DeepSpeed config file for all sides.
Needs deepspeed (`pip install -e '.[deepspeed,bench]'`); Accelerate's sides are left out when it is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

if __package__ in (None, ""):  # run as a script, as the launchers run the workers
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._launch import (  # noqa: E402
    forward, gather_peaks_mib, hasten_command, kib, launch, launch_env, markdown_head, markdown_row, memory_ratio,
    mlp_blocks, params_text, peaks_text, report, step_ratio, strategy_parser, timed_steps, worker_or_parent,
)

HASTEN_SIDES = ("ddp", "fsdp2", "zero2", "zero3")
ACCELERATE_SIDES = ("accelerate-zero2", "accelerate-zero3")


def _args(argv=None):
    parser = strategy_parser(__doc__.splitlines()[0], HASTEN_SIDES + ACCELERATE_SIDES, num_processes=2, dim=512,
                             depth=6, rows=64, steps=5)
    parser.add_argument("--no-accelerate", action="store_true")
    parser.add_argument("--sides", help="comma-separated subset of: " + ",".join(HASTEN_SIDES + ACCELERATE_SIDES))
    parser.add_argument("--config", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _model(dim: int, depth: int):
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(*mlp_blocks(dim, depth))


def _accelerator(args):
    if args.worker.startswith("accelerate"):
        from accelerate import Accelerator

        return Accelerator()  # DeepSpeed settings come from `accelerate launch --use_deepspeed ...`
    from hasten import Accelerator, DeepSpeedPlugin
    from hasten.config.fsdp import FullyShardedDataParallelPlugin

    if args.worker == "fsdp2":
        return Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    if args.worker.startswith("zero"):
        return Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=args.config))
    return Accelerator()


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    accelerator = _accelerator(args)
    if "zero" in args.worker:
        import deepspeed  # noqa: F401 - hasten imports it at prepare, Accelerate earlier: keep it out of both peaks
    baseline = kib("VmRSS")
    model = _model(args.dim, args.depth)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    rank = dist.get_rank() if dist.is_initialized() else 0
    generator = torch.Generator().manual_seed(rank)

    def step(x):
        accelerator.backward(model(x).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()

    batches = (torch.randn(args.rows, args.dim, generator=generator) for _ in range(2 + args.steps))
    step_s = timed_steps(step, batches, 2, args.steps, dist.barrier)
    peaks = gather_peaks_mib(kib("VmHWM") - baseline)
    mains = [None] * dist.get_world_size()
    dist.all_gather_object(mains, bool(accelerator.is_main_process))
    if rank == 0:
        report({"side": args.worker, "params": params, "step_s": step_s, "peak_mib": peaks, "mains": sum(mains)})


def _command(args, side: str, config: str) -> list:
    worker_argv = ["--worker", side, *forward(args, "dim", "depth", "rows", "steps"), "--config", config]
    if side.startswith("accelerate"):
        return [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(args.num_processes),
                "--use_deepspeed", "--deepspeed_config_file", config, "--mixed_precision", "no", __file__, *worker_argv]
    return hasten_command(__file__, args.num_processes, worker_argv)


def main(argv=None) -> int:
    return worker_or_parent(_args(argv), worker, compare)


def compare(args) -> int:
    """Launch each side with its DeepSpeed config, print the table."""
    from benchmarks._common import accelerate_available

    sides = list(HASTEN_SIDES)
    if not args.no_accelerate and accelerate_available():
        sides += ACCELERATE_SIDES
    if args.sides:
        sides = [side for side in sides if side in args.sides.split(",")]
    env = launch_env("HASTEN_", "ACCELERATE_", "FSDP_")
    env["DS_ACCELERATOR"] = "cpu"
    # Each launcher picks its own thread count (`hasten launch`: cores / processes; `accelerate launch
    # --use_deepspeed`: torch's default, every core): one setting for every side.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.num_processes)))
    results, folder = [], tempfile.mkdtemp(prefix="hasten-ds-bench-")
    for side in sides:
        stage = 3 if side.endswith("zero3") else 2
        config = os.path.join(folder, f"zero{stage}.json")
        with open(config, "w") as handle:
            json.dump({"train_micro_batch_size_per_gpu": args.rows, "gradient_accumulation_steps": 1,
                       "gradient_clipping": 1.0, "zero_optimization": {"stage": stage}}, handle)
        launched = launch(_command(args, side, config), env)
        results.append(launched.result or {"side": side, "failed": launched.error()})
    ok = [r for r in results if "failed" not in r]
    if not ok:
        print("every side failed:", results, file=sys.stderr)
        return 1
    print(f"model: {args.depth} MLP blocks of width {args.dim} = {params_text(ok[0]['params'])}, AdamW, fp32; "
          f"{args.num_processes} CPU processes (gloo), {args.rows} rows x {args.dim} per process per step; median of "
          f"{args.steps} steps\n")
    ddp = next((r for r in ok if r["side"] == "ddp"), None)
    print(markdown_head(["side", "step time (s)", "x DDP", "peak memory per process (MiB)", "x DDP",
                         "processes that say they are main"]))
    for r in results:
        if "failed" in r:
            print(markdown_row([r["side"], f"failed: {r['failed']}", "", "", "", ""]))
            continue
        step_x = f"{step_ratio(r, ddp):.2f}" if ddp else "—"
        memory_x = f"{memory_ratio(r, ddp):.2f}" if ddp else "—"
        print(markdown_row([r["side"], f"{r['step_s']:.3f}", step_x, peaks_text(r), memory_x, r["mains"]]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
