"""Save and load time of a ~500 MB model with AdamW state: hasten save_state/load_state vs raw torch.save/load.

    python benchmarks/checkpoint_io.py [--size-mb 500] [--repeats 2] [--dir /tmp] [--cold]

Every measurement writes the same tensors: the model's state dict and the AdamW state created by one step.
"raw torch" is torch.save of the two state dicts (no fsync, as most scripts do it), and "raw + fsync" adds the
fsync that makes them durable; hasten fsyncs every file and commits atomically, so the fair comparison is the
second. Loads read back from the page cache in every case, or with `--cold` (root only: it writes
/proc/sys/vm/drop_caches) from the disk, the page cache dropped before each load. "hasten, no checksums" is hasten with its checksums
switched off (not digested while saving, not in the marker, so not verified while loading): the ratio of the two
hasten rows is what the checksums cost (docs/checkpointing.md). With Accelerate installed
(`pip install accelerate==1.15.0`) its save_state/load_state is measured too. Outputs are deleted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import torch


def build(size_mb: int):
    width = 4096
    layers = max(1, round(size_mb * 2**20 / (4 * (width * width + width))))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def raw_torch(model, optimizer, folder, fsync: bool):
    def save():
        for name, obj in (("model.bin", model.state_dict()), ("optimizer.bin", optimizer.state_dict())):
            path = os.path.join(folder, name)
            torch.save(obj, path)
            if fsync:
                with open(path, "rb") as handle:
                    os.fsync(handle.fileno())

    def load():
        model.load_state_dict(torch.load(os.path.join(folder, "model.bin"), weights_only=True))
        optimizer.load_state_dict(torch.load(os.path.join(folder, "optimizer.bin"), weights_only=True))

    return save, load


def library(accelerator, folder):
    return (lambda: accelerator.save_state(folder)), (lambda: accelerator.load_state(folder))


def without_checksums(accelerator, folder):
    """hasten's save with its writers' digests switched off, then its load of a marker that has none."""
    from hasten.checkpoint.storage import checksum

    def save():
        update, record = checksum.Summer.update, checksum.Summer.record
        checksum.Summer.update = lambda self, data: None
        checksum.Summer.record = lambda self: None
        try:
            accelerator.save_state(folder)
        finally:
            checksum.Summer.update, checksum.Summer.record = update, record

    return save, (lambda: accelerator.load_state(folder))


def checksum_ab(accelerator, folder, rounds: int, cold: bool) -> None:
    """Load one checkpoint `rounds` times with and `rounds` times without its checksums, alternating (both share
    the machine's load as it drifts); the median of each, and their ratio."""
    import json
    import statistics

    accelerator.save_state(folder)
    marker_path = os.path.join(folder, "hasten_checkpoint.json")
    with open(marker_path) as handle:
        with_sums = handle.read()
    marker = json.loads(with_sums)
    marker.pop("checksums")
    without = json.dumps(marker)
    times = {"verified": [], "not verified": []}
    cpu = {"verified": [], "not verified": []}  # CPU seconds of all threads: steadier than wall time on a busy machine
    for _ in range(rounds):
        for label, text in (("verified", with_sums), ("not verified", without)):
            with open(marker_path, "w") as handle:
                handle.write(text)
            if cold:
                os.sync()
                with open("/proc/sys/vm/drop_caches", "w") as handle:
                    handle.write("3\n")
            start, start_cpu = time.perf_counter(), time.process_time()
            accelerator.load_state(folder)
            times[label].append(time.perf_counter() - start)
            cpu[label].append(time.process_time() - start_cpu)
    on, off = statistics.median(times["verified"]), statistics.median(times["not verified"])
    print(f"load_state, median of {rounds}: checksums verified {on:.3f} s, not verified {off:.3f} s: "
          f"x{on / off:.3f} (pairs: {', '.join(f'{a / b:.2f}' for a, b in zip(times['verified'], times['not verified']))})")
    folder_bytes = sum(os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder))
    on, off = statistics.median(cpu["verified"]), statistics.median(cpu["not verified"])
    print(f"  CPU time, median of {rounds}: verified {on:.3f} s, not verified {off:.3f} s: x{on / off:.3f}, "
          f"+{(on - off) / (folder_bytes / 1e9):.3f} s per GB")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mb", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--cold", action="store_true", help="drop the page cache before each load (root only)")
    parser.add_argument("--ab", type=int, default=0, metavar="N",
                        help="only the checksums' load cost: N loads of one checkpoint with its checksums verified, "
                             "alternating with N of the same bytes whose marker has none; prints the median ratio")
    args = parser.parse_args()
    if args.cold and not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        parser.error("--cold drops the page cache through /proc/sys/vm/drop_caches, which needs root")

    model, optimizer = build(args.size_mb)
    tensor_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    state_bytes = sum(v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values()
                      if isinstance(v, torch.Tensor))
    print(f"model {tensor_bytes / 1e6:.0f} MB + AdamW state {state_bytes / 1e6:.0f} MB, best of {args.repeats}")
    import hasten

    accelerator = hasten.Accelerator()
    accelerator.prepare(model, optimizer)
    root = tempfile.mkdtemp(prefix="hasten-bench-", dir=args.dir)
    if args.ab:
        try:
            checksum_ab(accelerator, os.path.join(root, "ab"), args.ab, args.cold)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return
    contenders = {
        "raw torch": lambda folder: raw_torch(model, optimizer, folder, fsync=False),
        "raw + fsync": lambda folder: raw_torch(model, optimizer, folder, fsync=True),
        "hasten": lambda folder: library(accelerator, folder),
        "hasten, no checksums": lambda folder: without_checksums(accelerator, folder),
    }
    try:
        import accelerate
    except ImportError:
        print("(accelerate not installed: pip install accelerate==1.15.0 to compare)")
    else:
        other = accelerate.Accelerator()
        other.prepare(model, optimizer)
        contenders[f"accelerate {accelerate.__version__}"] = lambda folder: library(other, folder)
    # Rounds of every contender in turn, best time of each kept: no one always goes first.
    results = {label: [float("inf"), float("inf")] for label in contenders}
    try:
        for _ in range(args.repeats):
            for label, make in contenders.items():
                folder = os.path.join(root, label.replace(" ", "_").replace("+", "plus"))
                os.makedirs(folder, exist_ok=True)
                save, load = make(folder)
                for slot, function in enumerate((save, load)):
                    if slot == 1 and args.cold:
                        os.sync()
                        with open("/proc/sys/vm/drop_caches", "w") as handle:
                            handle.write("3\n")
                    start = time.perf_counter()
                    function()
                    results[label][slot] = min(results[label][slot], time.perf_counter() - start)
                shutil.rmtree(folder)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    base_save, base_load = results["raw + fsync"]
    print(f"{'':24s}{'save s':>9s}{'load s':>9s}{'save/raw+fsync':>16s}{'load/raw+fsync':>16s}")
    for label, (save_s, load_s) in results.items():
        print(f"{label:24s}{save_s:9.2f}{load_s:9.2f}{save_s / base_save:16.2f}{load_s / base_load:16.2f}")
    (with_save, with_load), (off_save, off_load) = results["hasten"], results["hasten, no checksums"]
    print(f"checksums cost: save x{with_save / off_save:.3f}, load x{with_load / off_load:.3f}")


if __name__ == "__main__":
    main()
