"""Checksums for the files a library writes itself: torch.distributed.checkpoint's shards (`.distcp`, `.metadata`:
FSDP, tensor and pipeline parallelism) and DeepSpeed's folders.

hasten's own writers digest a file as they write it (`checksum.Summer`). These files are written by torch's or
DeepSpeed's code, so at the commit they are read back once, right after the save (from the page cache) and digested
in the same 16 MiB chunks, their specs marked `"pass": true`. The processes share the work: each lists what it sees
of the folder, every file goes to one process that sees it (round robin), and the digests reach the committing
process through one more gather. On `load_state` the marked files are verified in a pass of their own before the
library reads them, again shared among the processes; a mismatch anywhere raises the same `ChecksumError` on every
process, before any of them enters the library's collective load (no hang), so `automatic_resume` falls back to the
checkpoint before it as for any other damaged file.
"""

from __future__ import annotations

import os

from ..core.errors import ChecksumError
from .storage import checksum
from .storage import folder as folders
from .storage import paths
from .storage.threads import in_threads

PASS_KEY = "pass"  # in a checksum spec: verified in a pass of its own, not by hasten's readers as they read
_THREADS = 4  # file reads and xxhash/zlib release the GIL


def _digest_file(path: str) -> dict:
    return {**checksum.digest_file(path), PASS_KEY: True}


def _shared_out(names_seen: list, rank: int) -> list:
    """The names this process handles: each name to one of the processes that see it, in turn."""
    seers: dict = {}
    for process, names in enumerate(names_seen):
        for name in names:
            seers.setdefault(name, []).append(process)
    return [name for index, name in enumerate(sorted(seers)) if seers[name][index % len(seers[name])] == rank]


def digest_after_write(temp: str, reports: list, gather, rank: int) -> list:
    """Step 3c of a save, on every process, after each one reported its files (`reports[rank]` is (error, names,
    {name: spec})): the files in `temp` that no hasten writer digested get their checksums now. Returns `reports`
    with those specs added to rank 0's entry (the commit and the manifest take the specs of every entry)."""
    summed = {name for _, _, specs in reports for name in specs}
    if not {name for _, names, _ in reports for name in names} - summed:
        return reports  # hasten wrote every file (the same answer on every process: `reports` is gathered)
    seen = sorted(set(folders.sizes_under(temp, "")) - summed) if paths.is_dir(temp) else []
    mine = _shared_out(gather(seen), rank)
    specs = dict(zip(mine, in_threads(lambda name: _digest_file(os.path.join(temp, *name.split("/"))), mine, _THREADS)))
    extra = {name: spec for part in gather(specs) for name, spec in part.items()}
    if not extra:
        return reports
    error, names, first = reports[0]
    return [(error, names, {**first, **extra})] + list(reports[1:])


def verify_before_read(folder: str, marker: dict | None, gather, rank: int) -> None:
    """Before a load reads `folder`: the files whose checksums were taken after their library wrote them are read
    whole and compared, shared among the processes; raises `ChecksumError` (naming the file) on every process when
    any process found a mismatch. Files not on this process's disk (streamed from object storage) are skipped."""
    specs = {name: spec for name, spec in ((marker or {}).get("checksums") or {}).items()
             if isinstance(spec, dict) and spec.get(PASS_KEY) and checksum.available(spec.get("algorithm", ""))}
    if not specs:
        return
    seen = sorted(name for name in specs if paths.is_file(os.path.join(folder, *name.split("/"))))
    mine = _shared_out(gather(seen), rank)

    def check(name: str):
        try:
            checksum.verify_file(os.path.join(folder, *name.split("/")), specs[name])
        except ChecksumError as error:
            return str(error)
        return None

    found = [message for part in gather([m for m in in_threads(check, mine, _THREADS) if m]) for message in part]
    if found:
        raise ChecksumError(found[0] if len(found) == 1 else f"{found[0]} (and {len(found) - 1} more damaged file(s))")

