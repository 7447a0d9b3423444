"""What the checksums of library-written files cost: FSDP2 `SHARDED_STATE_DICT` save_state/load_state on 2 processes,
with the DCP shards digested at the commit and verified before the load (hasten's default), against the same calls
with that step switched off, and raw `torch.distributed.checkpoint` save/load of the same state.

    python benchmarks/engine_checksums.py [--size_mb 256] [--rounds 5] [--processes 2] [--cold]

The three sides alternate inside one launch (ABCABC...), each on a fresh folder, and each time is the slowest
process's (barriers around every call); saves are timed until save_state returns (fsynced and committed; raw DCP
does not fsync), loads read back from the page cache, or with `--cold` from the disk (every file fsynced and evicted
with posix_fadvise before the load). Medians; the ratio column is to raw DCP.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as `python benchmarks/engine_checksums.py`: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._launch import forward, hasten_command, launch, launch_env, report, strategy_parser

SIDES = ("hasten", "hasten, no library-file checksums", "raw DCP")


def worker(args) -> None:
    import statistics

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from hasten import Accelerator
    from hasten.checkpoint import engine_checksums
    from hasten.utils import FullyShardedDataParallelPlugin

    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2,
                                                                         state_dict_type="SHARDED_STATE_DICT"))
    width = 1024
    layers = max(1, round(args.size_mb * 2**20 / (4 * width * width)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward(model(torch.randn(4, width)).sum())
    optimizer.step()
    digest, verify = engine_checksums.digest_after_write, engine_checksums.verify_before_read
    shared = [tempfile.mkdtemp(dir=args.dir) if accelerator.is_main_process else None]
    dist.broadcast_object_list(shared, src=0)
    root = shared[0]

    def evict(folder: str) -> None:
        """With --cold: the folder's files out of the page cache (fsynced, posix_fadvise DONTNEED) before a load."""
        if args.cold and accelerator.is_main_process:
            for where, _, names in os.walk(folder):
                for name in names:
                    fd = os.open(os.path.join(where, name), os.O_RDONLY)
                    try:
                        os.fsync(fd)
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    finally:
                        os.close(fd)
        dist.barrier()

    def timed(call) -> float:
        dist.barrier()
        start = time.perf_counter()
        call()
        dist.barrier()
        return time.perf_counter() - start

    def hasten_side(checked: bool):
        engine_checksums.digest_after_write = digest if checked else (lambda temp, reports, gather, rank: reports)
        engine_checksums.verify_before_read = verify if checked else (lambda *a, **k: None)
        folder = os.path.join(root, "hasten")
        saved = timed(lambda: accelerator.save_state(folder))
        evict(folder)
        loaded = timed(lambda: accelerator.load_state(folder))
        return saved, loaded, folder

    def raw_side():
        folder = os.path.join(root, "raw")
        model_state, optim_state = get_state_dict(model, optimizer.optimizer)
        saved = timed(lambda: dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=folder))

        evict(folder)

        def load():
            state = {"model": model_state, "optim": optim_state}
            dcp.load(state, checkpoint_id=folder)
            set_state_dict(model, optimizer.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        return saved, timed(load), folder

    runs = {side: [] for side in SIDES}
    for _ in range(args.rounds + 1):  # the first round warms up and is dropped
        for side, run in zip(SIDES, (lambda: hasten_side(True), lambda: hasten_side(False), raw_side)):
            saved, loaded, folder = run()
            runs[side].append((saved, loaded))
            dist.barrier()
            if accelerator.is_main_process:
                shutil.rmtree(folder, ignore_errors=True)
            dist.barrier()
    if accelerator.is_main_process:
        shutil.rmtree(root, ignore_errors=True)
        report({side: [statistics.median(t[0] for t in times[1:]), statistics.median(t[1] for t in times[1:])]
                for side, times in runs.items()} | {"layers": layers})
    accelerator.end_training()


def parent(args) -> int:
    command = hasten_command(os.path.abspath(__file__), args.processes,
                             ["--worker", "run", *forward(args, "size_mb", "rounds"),
                              *(["--dir", args.dir] if args.dir else []),
                              *(["--cold"] if args.cold else [])])
    launched = launch(command, launch_env("HASTEN_", "ACCELERATE_"))
    if launched.result is None:
        launched.print_tail(3000)
        return 1
    result = launched.result
    raw_save, raw_load = result["raw DCP"]
    print(f"### Checksums of library-written files: FSDP2 SHARDED_STATE_DICT, {args.processes} processes, "
          f"{result['layers']} x Linear(1024, 1024) with AdamW state, medians of {args.rounds}, "
          f"{'cold' if args.cold else 'warm'} loads\n")
    print("| side | save | save / raw DCP | load | load / raw DCP |\n| --- | --- | --- | --- | --- |")
    for side in SIDES:
        save, load = result[side]
        print(f"| {side} | {save:.3f} s | {save / raw_save:.2f} | {load:.3f} s | {load / raw_load:.2f} |")
    (save, load), (bare_save, bare_load) = result[SIDES[0]], result[SIDES[1]]
    print(f"\nthe checksums cost: save x{save / bare_save:.3f}, load x{load / bare_load:.3f}")
    return 0


def main() -> int:
    parser = strategy_parser(__doc__.splitlines()[0], ("run",), {"size_mb": "model weights in MB",
                                                               "rounds": "timed rounds (after one warm-up)",
                                                               "processes": "processes"},
                             size_mb=256, rounds=5, processes=2)
    parser.add_argument("--dir", default=None, help="where the checkpoints go (default: the system temp dir)")
    parser.add_argument("--cold", action="store_true", help="loads read the disk (the files evicted from the cache)")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
