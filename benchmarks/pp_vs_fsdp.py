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

import json
import os
import subprocess
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.tp_vs_fsdp import _args as _tp_args, _kib, _model  # noqa: E402

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
    baseline = _kib("VmRSS")
    model = _model(args)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    rows = args.rows * n if pipelined else args.rows
    generator = torch.Generator().manual_seed(0 if pipelined else rank)
    times = []
    for step in range(2 + args.steps):
        x = torch.randn(rows, args.seq, args.dim, generator=generator)
        torch.distributed.barrier()
        start = time.perf_counter()
        if pipelined:
            loss = model(x, labels=torch.zeros(rows))
        else:
            loss = model(x).pow(2).mean()
        accelerator.backward(loss)
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
                   f"--worker={strategy}", "--microbatches", str(args.microbatches),
                   *(f"--{k}={getattr(args, k)}" for k in ("dim", "heads", "depth", "seq", "rows", "steps"))]
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
            return 1
        results.append(json.loads(lines[0][len("RESULT "):]))
    params = results[0]["params"]
    print(f"model: {args.depth} transformer blocks of width {args.dim} ({args.heads} heads) = {params / 1e6:.1f}M "
          f"parameters ({params * 4 / 2**20:.0f} MiB fp32), AdamW; {args.num_processes} CPU processes (gloo); global "
          f"batch {args.rows * args.num_processes} x {args.seq} tokens per step for every side; pp: "
          f"{args.microbatches} micro-batches; median of {args.steps} steps")
    print(f"{'strategy':<10}{'step time (s)':>15}{'x ddp':>8}{'peak memory per process/stage (MiB)':>40}{'x ddp':>8}")
    ddp = results[0]
    for r in results:
        peaks = " / ".join(f"{p:.0f}" for p in r["peak_mib"])
        print(f"{r['strategy']:<10}{r['step_s']:>15.3f}{r['step_s'] / ddp['step_s']:>8.2f}{peaks:>40}"
              f"{max(r['peak_mib']) / max(ddp['peak_mib']):>8.2f}")
    print(ACCELERATE_NOTE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
