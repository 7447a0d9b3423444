"""Checkpoint I/O: `save_state` / `load_state` of a model with its AdamW state, against raw
`torch.save` / `torch.load`, plain safetensors and Accelerate, with the disk's own bandwidth as the floor.

Every save is timed until its files are durable (each file fsynced; hasten does that itself, the others
get it added), and before every load the files are dropped from the page cache (posix_fadvise DONTNEED,
checked with mincore: the table notes how much of the files was still cached) so loads read the disk. The
floor is one large file of the same size written in 64 MB chunks and fsynced, then read back cold the way
`dd bs=64M` reads it. Sides alternate (ABCABC...); one model and optimizer are shared by all sides to keep
memory bounded. Outputs go to a temporary folder (default: the system temp dir; `--dir` to choose the disk)
and are deleted.
Run: `python -m benchmarks.save_load_state [--quick] [--size-mb 1024] [--repeats 3]`.
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as `python benchmarks/save_load_state.py`: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from benchmarks._common import (
    print_tables,
    ACCELERATE,
    ACCELERATE_LEFT_OUT,
    HASTEN,
    RAW,
    PeakRSS,
    Table,
    base_parser,
    fmt_mb,
    fmt_time,
    hasten_module_available,
    median,
    want_accelerate,
)

DISK = "disk floor (one file)"
SAFETENSORS = "safetensors"
CHUNK = 64 * 2**20


def _model(size_mb: int) -> torch.nn.Module:
    width = 2048 if size_mb >= 64 else 256
    per_layer = width * width * 4
    layers = max(1, round(size_mb * 2**20 / per_layer))
    return torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])


def _files(folder: str) -> list[str]:
    return [os.path.join(root, name) for root, _, names in os.walk(folder) for name in names]


def _fsync_tree(folder: str) -> None:
    for path in _files(folder):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _drop_cache(folder: str) -> float:
    """Evict the folder's (clean, fsynced) files from the page cache so the next read comes from disk; return
    the fraction of their pages still cached afterwards (nan where mincore is not available)."""
    resident, total = 0, 0
    for path in _files(folder):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        counted = _resident_pages(path)
        if counted is None:
            return float("nan")
        resident, total = resident + counted[0], total + counted[1]
    return resident / total if total else 0.0


def _resident_pages(path: str):
    """(pages in the page cache, pages) of a file, from mincore(2); None off Linux."""
    import ctypes
    import mmap

    size = os.path.getsize(path)
    if size == 0:
        return 0, 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    except (OSError, AttributeError):
        return None
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    with open(path, "rb") as handle:
        mapped = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_COPY)  # writable view: from_buffer needs it
        try:
            vector = (ctypes.c_ubyte * pages)()
            anchor = ctypes.c_char.from_buffer(mapped)
            status = libc.mincore(ctypes.addressof(anchor), size, vector)
            del anchor
        finally:
            mapped.close()
    if status != 0:
        return None
    return sum(v & 1 for v in vector), pages


def _tree_bytes(folder: str) -> int:
    return sum(os.path.getsize(p) for p in _files(folder))


class DiskFloor:
    """Write `nbytes` to one file in big chunks and fsync; read it back after dropping it from the cache."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.block = os.urandom(min(CHUNK, nbytes))
        self.buffer = bytearray(len(self.block))

    def save(self, folder: str) -> None:
        os.makedirs(folder)
        fd = os.open(os.path.join(folder, "blob"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            left = self.nbytes
            view = memoryview(self.block)
            while left > 0:
                left -= os.write(fd, view[: min(left, len(view))])
            os.fsync(fd)
        finally:
            os.close(fd)

    def load(self, folder: str) -> None:
        with open(os.path.join(folder, "blob"), "rb", buffering=0) as f:
            while f.readinto(self.buffer):
                pass


class RawTorch:
    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def save(self, folder: str) -> None:
        os.makedirs(folder)
        torch.save(self.model.state_dict(), os.path.join(folder, "model.pt"))
        torch.save(self.optimizer.state_dict(), os.path.join(folder, "optimizer.pt"))
        _fsync_tree(folder)

    def load(self, folder: str) -> None:
        self.model.load_state_dict(torch.load(os.path.join(folder, "model.pt"), weights_only=True))
        self.optimizer.load_state_dict(torch.load(os.path.join(folder, "optimizer.pt"), weights_only=True))


class Safetensors:
    """safetensors' own `save_file` / `load_file`: the model's tensors, and the optimizer's state tensors under
    flat names (`<param>.<key>`) with its param groups taken from the live optimizer."""

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def save(self, folder: str) -> None:
        from safetensors.torch import save_file

        os.makedirs(folder)
        save_file({k: v.contiguous() for k, v in self.model.state_dict().items()}, os.path.join(folder, "model.safetensors"))
        flat = {f"{index}.{key}": value for index, state in self.optimizer.state_dict()["state"].items()
                for key, value in state.items() if isinstance(value, torch.Tensor)}
        save_file(flat, os.path.join(folder, "optimizer.safetensors"))
        _fsync_tree(folder)

    def load(self, folder: str) -> None:
        from safetensors.torch import load_file

        self.model.load_state_dict(load_file(os.path.join(folder, "model.safetensors")))
        state: dict = {}
        for name, value in load_file(os.path.join(folder, "optimizer.safetensors")).items():
            index, key = name.split(".", 1)
            state.setdefault(int(index), {})[key] = value
        self.optimizer.load_state_dict({"state": state, "param_groups": self.optimizer.state_dict()["param_groups"]})


class Library:
    """hasten or Accelerate: `Accelerator.save_state` / `load_state` on the shared model and optimizer."""

    def __init__(self, name, model, optimizer):
        if name == HASTEN:
            from hasten import Accelerator
            from hasten.state import AcceleratorState, GradientState
        else:
            from accelerate import Accelerator
            from accelerate.state import AcceleratorState, GradientState
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        self.accelerator = Accelerator(cpu=True)
        # Both libraries mark what they prepared with the same attribute; the other library's mark would make
        # this one take the shared model as already prepared (and, in hasten, leave it out of save_state).
        for obj in (model, optimizer):
            obj.__dict__.pop("_is_accelerate_prepared", None)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)

    def save(self, folder: str) -> None:
        self.accelerator.save_state(folder)
        _fsync_tree(folder)

    def load(self, folder: str) -> None:
        self.accelerator.load_state(folder)


def _own_memory(optimizer) -> None:
    """Give the shared optimizer's state tensors memory of their own again, untimed, as the training step after a
    load does: safetensors' `load_file` hands out tensors mapped from the file, and the next side's save would
    otherwise read them back from that (deleted, cold) file and its load write into them page by page through it."""
    for state in optimizer.state.values():
        for key, value in list(state.items()):
            if isinstance(value, torch.Tensor):
                state[key] = value.clone()


def run(args) -> list[Table]:
    torch.set_num_threads(min(4, os.cpu_count() or 1))
    size_mb = args.size_mb or (8 if args.quick else 1024)
    repeats = args.repeats or (1 if args.quick else 3)
    base = args.dir or tempfile.gettempdir()
    free = shutil.disk_usage(base).free
    model = _model(size_mb)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    # One step so that AdamW holds its two moment buffers: the checkpoint is ~3x the weights. Random gradients
    # keep the moments incompressible, like the floor's random bytes: a disk (or a VM's host) that compresses
    # or deduplicates would otherwise write and read constant moment buffers faster than any real checkpoint.
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    expected = 3 * weights
    if free < 3 * expected:
        raise SystemExit(f"save_load_state: {base} has {free / 2**30:.1f} GiB free; need about "
                         f"{3 * expected / 2**30:.1f} GiB for --size-mb {size_mb} (pass a smaller --size-mb or --dir)")

    sides = {DISK: DiskFloor(expected), RAW: RawTorch(model, optimizer), SAFETENSORS: Safetensors(model, optimizer)}
    notes = []
    if want_accelerate(args):
        sides[ACCELERATE] = Library(ACCELERATE, model, optimizer)
    else:
        notes.append(ACCELERATE_LEFT_OUT)
    if hasten_module_available("checkpointing"):
        sides[HASTEN] = Library(HASTEN, model, optimizer)
    else:
        notes.append("hasten skipped: this checkout has no `hasten.checkpointing` yet.")

    workdir = tempfile.mkdtemp(prefix="hasten-bench-ckpt-", dir=base)
    results = {name: {"save": [], "load": [], "bytes": 0, "save_rss": 0, "load_rss": 0} for name in sides}
    still_cached = []
    gc.collect()
    try:
        names = list(sides)
        for round_index in range(repeats):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                side, out = sides[name], os.path.join(workdir, "ckpt")
                with PeakRSS() as rss:
                    start = time.perf_counter()
                    side.save(out)
                    results[name]["save"].append(time.perf_counter() - start)
                results[name]["save_rss"] = max(results[name]["save_rss"], rss.growth)
                results[name]["bytes"] = _tree_bytes(out)
                still_cached.append(_drop_cache(out))
                with PeakRSS() as rss:
                    start = time.perf_counter()
                    side.load(out)
                    results[name]["load"].append(time.perf_counter() - start)
                results[name]["load_rss"] = max(results[name]["load_rss"], rss.growth)
                _own_memory(optimizer)
                shutil.rmtree(out)
                gc.collect()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    floor = {op: results[DISK]["bytes"] / median(results[DISK][op]) for op in ("save", "load")}
    table = Table(f"Checkpoint I/O: model of {weights / 2**20:.0f} MB + AdamW state",
                  ["side", "written", "save", "save MB/s", "save vs disk", "load", "load MB/s", "load vs disk",
                   "peak RSS growth save / load"])
    for name in names:
        r = results[name]
        row = [name, fmt_mb(r["bytes"])]
        for op in ("save", "load"):
            seconds = median(r[op])
            rate = r["bytes"] / seconds
            row += [fmt_time(seconds), f"{rate / 2**20:.0f}", f"{rate / floor[op]:.2f}"]
        row.append(f"{fmt_mb(r['save_rss'])} / {fmt_mb(r['load_rss'])}")
        table.rows.append(row)
    cached = max(still_cached) if still_cached and all(c == c for c in still_cached) else None
    table.notes.append(
        f"{repeats} save+load rounds per side, interleaved, medians; saves are timed until fsynced, loads read "
        "cold files (evicted with posix_fadvise; "
        + (f"at most {cached:.1%} of a checkpoint's pages were still cached before a load" if cached is not None
           else "residency not checked: no mincore here")
        + f"). Folder on the disk of {base}. Targets (issue 38): hasten save ≥ 0.9 × disk, cold load ≥ 0.9 × disk."
    )
    table.notes.extend(notes)
    return [table]


def build_parser():
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=None, help="model weights in MB (default 1024; 8 with --quick)")
    parser.add_argument("--dir", default=None, help="folder on the disk to measure (default: the temp dir)")
    return parser


def main(argv=None) -> int:
    return print_tables(run(build_parser().parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
