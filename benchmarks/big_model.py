"""Big-model inference: loading a sharded safetensors checkpoint into an empty (meta) model and running it, in RAM
and with half of the layers offloaded to disk, for hasten, raw PyTorch and Accelerate side by side.

Rows:
1. meta init + load in RAM, time to first output (and the process's peak RSS);
2. half of the layers offloaded to disk, time to first output (the offload folder starts empty);
3. one forward pass with half of the layers on disk, against the same library's all-in-RAM forward.

Each measurement runs in a fresh process (clean RSS, no warm caches inside the library). The checkpoint is
read once before timing, so its files are in the page cache: the rows measure the libraries, not the disk.
Raw PyTorch has no disk offload: its rows 2-3 are blank. Sides alternate (ABCABC...).
Run: `python -m benchmarks.big_model [--quick] [--size-mb 2048]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as `python benchmarks/big_model.py`: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import (
    ACCELERATE,
    ACCELERATE_LEFT_OUT,
    HASTEN,
    RAW,
    REPO,
    Table,
    base_parser,
    clean_env,
    fmt_mb,
    fmt_time,
    interleave,
    median,
    print_tables,
    want_accelerate,
)

SHARD_MB = 256


def _model_class():
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.norm = nn.LayerNorm(dim)
            self.up = nn.Linear(dim, 4 * dim)
            self.down = nn.Linear(4 * dim, dim)

        def forward(self, x):
            return x + self.down(torch.relu(self.up(self.norm(x))))

    class Stack(nn.Module):
        def __init__(self, dim, depth):
            super().__init__()
            self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    return Stack


def _shape(size_mb: int) -> tuple[int, int]:
    """(width, depth) of a model of about `size_mb` MB in fp32, at least 4 blocks."""
    dim = 2048 if size_mb >= 1024 else 1024 if size_mb >= 128 else 256
    per_block = 8 * dim * dim * 4
    return dim, max(4, round(size_mb * 2**20 / per_block))


def _device_map(depth: int, half_on_disk: bool) -> dict:
    if not half_on_disk:
        return {"": "cpu"}
    return {f"blocks.{i}": "cpu" if i < depth // 2 else "disk" for i in range(depth)}


def write_checkpoint(folder: str, size_mb: int) -> tuple[int, int]:
    """A Hugging Face style sharded safetensors checkpoint (`model.safetensors.index.json` + shards)."""
    import torch
    from safetensors.torch import save_file

    dim, depth = _shape(size_mb)
    torch.manual_seed(0)
    state = _model_class()(dim, depth).state_dict()
    shards, current, size = [], {}, 0
    for name, tensor in state.items():
        if current and size + tensor.numel() * 4 > SHARD_MB * 2**20:
            shards.append(current)
            current, size = {}, 0
        current[name] = tensor
        size += tensor.numel() * 4
    shards.append(current)
    weight_map = {}
    for index, shard in enumerate(shards):
        file = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(folder, file), metadata={"format": "pt"})
        weight_map.update({name: file for name in shard})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as handle:
        json.dump({"metadata": {}, "weight_map": weight_map}, handle)
    return dim, depth


# -- the child process: one library, one configuration ----------------------------------------------------------
def _child(side: str, checkpoint: str, dim: int, depth: int, half_on_disk: bool, forwards: int, threads: int) -> dict:
    import torch

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    x = torch.randn(1, 16, dim)
    Stack = _model_class()
    offload = tempfile.mkdtemp(prefix="bench-offload-")
    # Imports are not timed: the rows measure loading, not start-up (see benchmarks/startup.py for that).
    if side == RAW:
        from safetensors.torch import load_file
    else:
        library = __import__("hasten" if side == HASTEN else "accelerate")
        library.load_checkpoint_and_dispatch, library.init_empty_weights  # load the lazy names
    baseline = _status_bytes("VmRSS")
    anon_baseline = _status_bytes("RssAnon")
    try:
        start = time.perf_counter()
        if side == RAW:
            with torch.device("meta"):
                model = Stack(dim, depth)
            for file in sorted(f for f in os.listdir(checkpoint) if f.endswith(".safetensors")):
                model.load_state_dict(load_file(os.path.join(checkpoint, file)), strict=False, assign=True)
        else:
            with library.init_empty_weights():
                model = Stack(dim, depth)
            model = library.load_checkpoint_and_dispatch(model, checkpoint,
                                                         device_map=_device_map(depth, half_on_disk),
                                                         offload_folder=offload)
        with torch.no_grad():
            first = model(x)
        first_output = time.perf_counter() - start
        times = []
        with torch.no_grad():
            for _ in range(forwards):
                began = time.perf_counter()
                model(x)
                times.append(time.perf_counter() - began)
        return {"first_output": first_output, "forward": median(times), "peak_rss": _status_bytes("VmHWM"),
                "rss_growth": _status_bytes("VmHWM") - baseline, "anon_growth": _status_bytes("RssAnon") - anon_baseline,
                "checksum": float(first.double().sum())}
    finally:
        shutil.rmtree(offload, ignore_errors=True)


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field + ":"))


def _run_child(side, checkpoint, dim, depth, half_on_disk, forwards, threads) -> dict:
    command = [sys.executable, "-m", "benchmarks.big_model", "--child",
               json.dumps([side, checkpoint, dim, depth, half_on_disk, forwards, threads])]
    done = subprocess.run(command, cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{side} child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def build_parser():
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=None, help="checkpoint size (default 2048; --quick: 16)")
    parser.add_argument("--forwards", type=int, default=None, help="timed forwards per run (median taken)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads in each run (default 1: steadier on a shared machine; 0: torch's default)")
    parser.add_argument("--dir", default=None, help="where to write the checkpoint (default: system temp dir)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)  # internal: one measurement
    return parser


def run(args) -> list[Table]:
    size_mb = args.size_mb or (16 if args.quick else 2048)
    repeats = args.repeats or (1 if args.quick else 3)
    forwards = args.forwards or (2 if args.quick else 5)
    sides = [RAW, HASTEN] + ([ACCELERATE] if want_accelerate(args) else [])
    folder = tempfile.mkdtemp(prefix="bench-big-model-", dir=args.dir)
    try:
        dim, depth = write_checkpoint(folder, size_mb)
        total = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        for file in os.listdir(folder):  # into the page cache, for every side alike
            with open(os.path.join(folder, file), "rb") as handle:
                while handle.read(64 * 2**20):
                    pass
        results = {}
        for half in (False, True):
            runners = {side: (lambda s=side: _run_child(s, folder, dim, depth, half, forwards, args.threads))
                       for side in sides if not (half and side == RAW)}
            # interleave wants numbers: keep the whole result dicts aside
            kept = {side: [] for side in runners}

            def measure(side):
                result = runners[side]()
                kept[side].append(result)
                return result["first_output"]

            interleave({side: (lambda s=side: measure(s)) for side in runners}, repeats=repeats, warmup=0)
            for side, values in kept.items():
                results[(side, half)] = {key: median([v[key] for v in values]) for key in values[0]}
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    def cell(side, half, key, fmt):
        value = results.get((side, half))
        return fmt(value[key]) if value else "—"

    columns = ["row", *sides]
    table = Table(title=f"Big-model inference ({total / 2**20:.0f} MB sharded safetensors, {depth} blocks of "
                        f"width {dim})", columns=columns)
    table.rows.append(["meta init + load in RAM: time to first output",
                       *(cell(s, False, "first_output", fmt_time) for s in sides)])
    table.rows.append(["  peak RSS of that process", *(cell(s, False, "peak_rss", fmt_mb) for s in sides)])
    table.rows.append(["  peak RSS growth from loading to output", *(cell(s, False, "rss_growth", fmt_mb) for s in sides)])
    table.rows.append(["  of which anonymous (not page cache) at the end",
                       *(cell(s, False, "anon_growth", fmt_mb) for s in sides)])
    table.rows.append(["half of the layers on disk: time to first output",
                       *(cell(s, True, "first_output", fmt_time) for s in sides)])
    table.rows.append(["forward, all in RAM", *(cell(s, False, "forward", fmt_time) for s in sides)])
    table.rows.append(["forward, half on disk", *(cell(s, True, "forward", fmt_time) for s in sides)])

    def slowdown(side):
        ram, disk = results.get((side, False)), results.get((side, True))
        return f"{disk['forward'] / ram['forward']:.2f}×" if ram and disk else "—"

    table.rows.append(["forward half on disk / all in RAM", *(slowdown(s) for s in sides)])
    if (HASTEN, False) in results and (RAW, False) in results:
        same = abs(results[(HASTEN, False)]["checksum"] - results[(RAW, False)]["checksum"]) < 1e-3 * (
            1 + abs(results[(RAW, False)]["checksum"]))
        table.notes.append(f"outputs of hasten and raw torch {'agree' if same else 'DIFFER'} (checksum)")
    table.notes.append(f"{repeats} run(s) per cell, each a fresh process (median); forward = median of {forwards} "
                       f"forwards of a (1, 16, width) input after the first; checkpoint in the page cache; "
                       f"torch threads: {args.threads or 'default'}.")
    table.notes.append("raw torch: `safetensors.torch.load_file` per shard + `load_state_dict(assign=True)` into a "
                       "meta model; it has no disk offload.")
    if ACCELERATE not in sides:
        table.notes.append(ACCELERATE_LEFT_OUT)
    return [table]


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.child:
        print(json.dumps(_child(*json.loads(args.child))))
        return 0
    return print_tables(run(args))


if __name__ == "__main__":
    sys.exit(main())
