"""Ulysses sequence parallelism (hasten's, sp=2) vs DDP on CPU processes: step time and peak memory per process, side by
side, at growing sequence lengths.

    python benchmarks/sp_vs_ddp.py [--num_processes 2] [--seqs 1024,2048,4096] [--hidden 256] [--heads 8] [--layers 4]
                                   [--attn sdpa] [--steps 3] [--limit_mib 0] [--quick]

One Llama built from a config (transformers), one sequence per step. DDP: each process trains on its own whole
sequence (so a step covers num_processes sequences); sp: the processes of the sp group share one sequence, each
holding 1/sp of it (a step covers one). Peak memory (VmHWM over the model's baseline) is what decides the longest
sequence that fits; step time is per step, and per token (a step of DDP covers num_processes times the tokens).
With --limit_mib the table ends with the longest sequence each side keeps under that peak. Each side and length
runs in fresh processes (`hasten launch`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

SIDES = ("ddp", "sp")


def _args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_processes", type=int, default=2)
    parser.add_argument("--seqs", default="1024,2048,4096")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"))
    parser.add_argument("--steps", type=int, default=3, help="timed steps (after 1 warm-up step)")
    parser.add_argument("--limit_mib", type=float, default=0, help="report the longest sequence under this peak")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the benchmark runs")
    parser.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--seq", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.seqs, args.hidden, args.layers, args.steps = "64", 64, 1, 1
    return args


def _kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def worker(args) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from hasten import Accelerator, ParallelismConfig
    from hasten.distributed.sequence_parallel import causal_lm_loss

    n = args.num_processes
    config = ParallelismConfig(dp_replicate_size=n) if args.worker == "ddp" else ParallelismConfig(
        sp_size=n, sp_backend="hasten")
    accelerator = Accelerator(parallelism_config=config)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=1024, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                                         num_key_value_heads=args.heads, max_position_embeddings=args.seq,
                                         attn_implementation=args.attn))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(accelerator.process_index if args.worker == "ddp" else 0)
    rows = [{"input_ids": torch.randint(0, 1024, (args.seq,), generator=generator)} for _ in range(1 + args.steps)]

    def collate(items):
        ids = torch.stack([item["input_ids"] for item in items])
        return {"input_ids": ids, "labels": ids.clone()}

    # DDP: each process its own sequences (a loader over num_processes times the rows); sp: one shared sequence
    loader = torch.utils.data.DataLoader(rows * (n if args.worker == "ddp" else 1), batch_size=1, collate_fn=collate)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    baseline = _kib("VmHWM")
    times = []
    for step, batch in enumerate(loader):
        if step > args.steps:
            break
        torch.distributed.barrier()
        start = time.perf_counter()
        if args.worker == "sp":
            logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
            loss = causal_lm_loss(logits, batch["shift_labels"])
        else:
            loss = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        torch.distributed.barrier()
        if step >= 1:
            times.append(time.perf_counter() - start)
    peak = (_kib("VmHWM") - baseline) / 1024
    peaks = [None] * n
    torch.distributed.all_gather_object(peaks, peak)
    if accelerator.is_main_process:
        print("RESULT " + json.dumps({"side": args.worker, "seq": args.seq, "step_s": sorted(times)[len(times) // 2],
                                      "peak_mib": peaks}))
    torch.distributed.destroy_process_group()


def main(argv=None) -> int:
    args = _args(argv)
    if args.worker:
        worker(args)
        return 0
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HASTEN_", "ACCELERATE_", "FSDP_", "PARALLELISM_"))}
    n = args.num_processes
    print(f"### Ulysses sp={n} vs DDP ({n} CPU processes, gloo; Llama {args.layers} layers x {args.hidden} wide, "
          f"{args.heads} heads, {args.attn} attention; AdamW; one sequence per process (DDP) or per sp group; "
          f"median of {args.steps} steps)")
    print("| sequence | side | step time (s) | tokens/s | peak memory per process (MiB) |")
    print("| --- | --- | --- | --- | --- |")
    fits = {side: 0 for side in SIDES}
    for seq in (int(s) for s in args.seqs.split(",")):
        for side in SIDES:
            command = [sys.executable, "-m", "hasten", "launch", "--num_processes", str(n), "--main_process_port", "0",
                       __file__, "--worker", side, "--seq", str(seq),
                       *(f"--{k}={getattr(args, k)}" for k in ("num_processes", "hidden", "heads", "layers", "attn",
                                                               "steps"))]
            done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if done.returncode != 0 or not lines:
                print(f"| {seq} | {side} | failed (exit {done.returncode}) | | |")
                print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
                continue
            result = json.loads(lines[-1][len("RESULT "):])
            tokens = seq * (n if side == "ddp" else 1)
            peaks = " / ".join(f"{p:.0f}" for p in result["peak_mib"])
            print(f"| {seq} | {side} | {result['step_s']:.3f} | {tokens / result['step_s']:.0f} | {peaks} |")
            if not args.limit_mib or max(result["peak_mib"]) <= args.limit_mib:
                fits[side] = max(fits[side], seq)
    if args.limit_mib:
        print(f"\nlongest sequence under {args.limit_mib:.0f} MiB per process: "
              + ", ".join(f"{side} {fits[side] or 'none'}" for side in SIDES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
