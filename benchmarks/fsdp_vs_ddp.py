"""FSDP2 vs DDP on CPU processes: step time and peak memory per process, side by side.

    python benchmarks/fsdp_vs_ddp.py [--num_processes 2] [--dim 768] [--depth 8] [--rows 256] [--steps 5]

The script launches itself once per strategy (`hasten launch`, so each strategy starts from a fresh process
and its peak memory is its own), then prints one table. Same model, data, AdamW optimizer and seed for both.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

STRATEGIES = ("ddp", "fsdp2")


def _args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_processes", type=int, default=2)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--rows", type=int, default=256, help="rows per process per step")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (after 2 warm-up steps)")
    parser.add_argument("--worker", choices=STRATEGIES, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def worker(args) -> None:
    import torch

    from hasten import Accelerator
    from hasten.config.fsdp import FullyShardedDataParallelPlugin

    class Block(torch.nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.norm = torch.nn.LayerNorm(dim)
            self.up = torch.nn.Linear(dim, 4 * dim)
            self.down = torch.nn.Linear(4 * dim, dim)

        def forward(self, x):
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

    plugin = None
    if args.worker == "fsdp2":
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                                transformer_cls_names_to_wrap=["Block"])
    accelerator = Accelerator(fsdp_plugin=plugin)
    baseline = _kib("VmRSS")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block(args.dim) for _ in range(args.depth)])
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    generator = torch.Generator().manual_seed(accelerator.process_index)
    times = []
    for step in range(2 + args.steps):
        x = torch.randn(args.rows, args.dim, generator=generator)
        accelerator.wait_for_everyone()
        start = time.perf_counter()
        loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        accelerator.wait_for_everyone()
        if step >= 2:
            times.append(time.perf_counter() - start)
    peak = _kib("VmHWM") - baseline
    peaks = [None] * accelerator.num_processes
    torch.distributed.all_gather_object(peaks, peak)
    if accelerator.is_main_process:
        print("RESULT " + json.dumps({"strategy": args.worker, "params": params, "step_s": sorted(times)[len(times) // 2],
                                      "peak_mib": [p / 1024 for p in peaks]}))
    accelerator.end_training()


def main(argv=None) -> int:
    args = _args(argv)
    if args.worker:
        worker(args)
        return 0
    results = []
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HASTEN_", "ACCELERATE_", "FSDP_"))}
    for strategy in STRATEGIES:
        command = [sys.executable, "-m", "hasten", "launch", "--num_processes", str(args.num_processes), __file__,
                   "--worker", strategy, "--dim", str(args.dim), "--depth", str(args.depth), "--rows", str(args.rows),
                   "--steps", str(args.steps)]
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
            return 1
        results.append(json.loads(lines[0][len("RESULT "):]))
    params = results[0]["params"]
    print(f"model: {args.depth} MLP blocks of width {args.dim} = {params / 1e6:.1f}M parameters "
          f"({params * 4 / 2**20:.0f} MiB fp32), AdamW; {args.num_processes} CPU processes (gloo), "
          f"{args.rows} rows x {args.dim} per process per step; median of {args.steps} steps")
    print(f"{'strategy':<10}{'step time (s)':>15}{'peak memory per process (MiB)':>34}")
    for r in results:
        peaks = " / ".join(f"{p:.0f}" for p in r["peak_mib"])
        print(f"{r['strategy']:<10}{r['step_s']:>15.3f}{peaks:>34}")
    ddp, fsdp = results
    print(f"fsdp2/ddp: step time x{fsdp['step_s'] / ddp['step_s']:.2f}, "
          f"peak memory x{max(fsdp['peak_mib']) / max(ddp['peak_mib']):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
