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
import subprocess
import sys
import tempfile
import time

HASTEN_SIDES = ("ddp", "fsdp2", "zero2", "zero3")
ACCELERATE_SIDES = ("accelerate-zero2", "accelerate-zero3")


def _args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_processes", type=int, default=2)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--rows", type=int, default=64, help="rows per process per step")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (after 2 warm-up steps)")
    parser.add_argument("--no-accelerate", action="store_true")
    parser.add_argument("--sides", help="comma-separated subset of: " + ",".join(HASTEN_SIDES + ACCELERATE_SIDES))
    parser.add_argument("--worker", choices=HASTEN_SIDES + ACCELERATE_SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _model(dim: int, depth: int):
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(dim)
            self.up = torch.nn.Linear(dim, 4 * dim)
            self.down = torch.nn.Linear(4 * dim, dim)

        def forward(self, x):
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

    torch.manual_seed(0)
    return torch.nn.Sequential(*[Block() for _ in range(depth)])


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
    baseline = _kib("VmRSS")
    model = _model(args.dim, args.depth)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    rank = dist.get_rank() if dist.is_initialized() else 0
    generator = torch.Generator().manual_seed(rank)
    times = []
    for step in range(2 + args.steps):
        x = torch.randn(args.rows, args.dim, generator=generator)
        dist.barrier()
        start = time.perf_counter()
        loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        dist.barrier()
        if step >= 2:
            times.append(time.perf_counter() - start)
    peak = _kib("VmHWM") - baseline
    peaks = [None] * dist.get_world_size()
    dist.all_gather_object(peaks, peak)
    mains = [None] * dist.get_world_size()
    dist.all_gather_object(mains, bool(accelerator.is_main_process))
    if rank == 0:
        print("RESULT " + json.dumps({"side": args.worker, "params": params, "step_s": sorted(times)[len(times) // 2],
                                      "peak_mib": [p / 1024 for p in peaks], "mains": sum(mains)}), flush=True)


def _command(args, side: str, config: str) -> list:
    common = [__file__, "--worker", side, "--dim", str(args.dim), "--depth", str(args.depth), "--rows",
              str(args.rows), "--steps", str(args.steps), "--config", config]
    if side.startswith("accelerate"):
        return [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(args.num_processes),
                "--use_deepspeed", "--deepspeed_config_file", config, "--mixed_precision", "no", *common]
    return [sys.executable, "-m", "hasten", "launch", "--num_processes", str(args.num_processes), *common]


def main(argv=None) -> int:
    args = _args(argv)
    if args.worker:
        worker(args)
        return 0
    from benchmarks._common import accelerate_available

    sides = list(HASTEN_SIDES)
    if not args.no_accelerate and accelerate_available():
        sides += ACCELERATE_SIDES
    if args.sides:
        sides = [side for side in sides if side in args.sides.split(",")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HASTEN_", "ACCELERATE_", "FSDP_"))}
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
        done = subprocess.run(_command(args, side, config), capture_output=True, text=True, env=env)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            errors = [line for line in (done.stderr + done.stdout).splitlines() if "Error" in line]
            results.append({"side": side, "failed": (errors or ["no result"])[-1][:160]})
            continue
        results.append(json.loads(lines[0][len("RESULT "):]))
    ok = [r for r in results if "failed" not in r]
    if not ok:
        print("every side failed:", results, file=sys.stderr)
        return 1
    params = ok[0]["params"]
    print(f"model: {args.depth} MLP blocks of width {args.dim} = {params / 1e6:.1f}M parameters "
          f"({params * 4 / 2**20:.0f} MiB fp32), AdamW, fp32; {args.num_processes} CPU processes (gloo), "
          f"{args.rows} rows x {args.dim} per process per step; median of {args.steps} steps\n")
    ddp = next((r for r in ok if r["side"] == "ddp"), None)
    print("| side | step time (s) | x DDP | peak memory per process (MiB) | x DDP | processes that say they are main |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in results:
        if "failed" in r:
            print(f"| {r['side']} | failed: {r['failed']} | | | | |")
            continue
        peaks = " / ".join(f"{p:.0f}" for p in r["peak_mib"])
        step_ratio = f"{r['step_s'] / ddp['step_s']:.2f}" if ddp else "—"
        mem_ratio = f"{max(r['peak_mib']) / max(ddp['peak_mib']):.2f}" if ddp else "—"
        print(f"| {r['side']} | {r['step_s']:.3f} | {step_ratio} | {peaks} | {mem_ratio} | {r['mains']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
