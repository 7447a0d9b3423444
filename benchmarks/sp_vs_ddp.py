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
import os
import sys

if __package__ in (None, ""):  # run as a script, as `hasten launch` runs the workers
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._launch import (  # noqa: E402
    forward, hasten_command, kib, launch, launch_env, markdown_head, markdown_row, peaks_text, report_peaks,
    strategy_parser, timed_steps, worker_or_parent,
)

SIDES = ("ddp", "sp")


def _args(argv=None):
    parser = strategy_parser(__doc__.splitlines()[0], SIDES, num_processes=2, seqs="1024,2048,4096", hidden=256,
                             heads=8, layers=4)
    parser.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"))
    parser.add_argument("--steps", type=int, default=3, help="timed steps (after 1 warm-up step)")
    parser.add_argument("--limit_mib", type=float, default=0, help="report the longest sequence under this peak")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the benchmark runs")
    parser.add_argument("--seq", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.seqs, args.hidden, args.layers, args.steps = "64", 64, 1, 1
    return args


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
    baseline = kib("VmHWM")
    logits = None

    def step(batch):
        nonlocal logits  # sp: kept until the next step's logits replace it, part of the peak as in a plain loop
        if args.worker == "sp":
            logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
            loss = causal_lm_loss(logits, batch["shift_labels"])
        else:
            loss = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()

    step_s = timed_steps(step, loader, 1, args.steps, torch.distributed.barrier)
    report_peaks(accelerator.is_main_process, baseline, side=args.worker, seq=args.seq, step_s=step_s)
    torch.distributed.destroy_process_group()


def main(argv=None) -> int:
    return worker_or_parent(_args(argv), worker, compare)


def compare(args) -> int:
    """Launch each side at each sequence length, print a row as each ends."""
    env = launch_env("HASTEN_", "ACCELERATE_", "FSDP_", "PARALLELISM_")
    n = args.num_processes
    print(f"### Ulysses sp={n} vs DDP ({n} CPU processes, gloo; Llama {args.layers} layers x {args.hidden} wide, "
          f"{args.heads} heads, {args.attn} attention; AdamW; one sequence per process (DDP) or per sp group; "
          f"median of {args.steps} steps)")
    print(markdown_head(["sequence", "side", "step time (s)", "tokens/s", "peak memory per process (MiB)"]))
    fits = {side: 0 for side in SIDES}
    for seq in (int(s) for s in args.seqs.split(",")):
        for side in SIDES:
            launched = launch(hasten_command(__file__, n, ["--worker", side, "--seq", str(seq), *forward(
                args, "num_processes", "hidden", "heads", "layers", "attn", "steps")], ["--main_process_port", "0"]), env)
            result = launched.result
            if result is None:
                print(markdown_row([seq, side, f"failed (exit {launched.returncode})", "", ""]))
                launched.print_tail(2000)
                continue
            tokens = seq * (n if side == "ddp" else 1)
            print(markdown_row([seq, side, f"{result['step_s']:.3f}", f"{tokens / result['step_s']:.0f}",
                                peaks_text(result)]))
            if not args.limit_mib or max(result["peak_mib"]) <= args.limit_mib:
                fits[side] = max(fits[side], seq)
    if args.limit_mib:
        print(f"\nlongest sequence under {args.limit_mib:.0f} MiB per process: "
              + ", ".join(f"{side} {fits[side] or 'none'}" for side in SIDES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
