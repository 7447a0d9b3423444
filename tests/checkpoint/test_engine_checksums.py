"""Bit rot in the files a library writes itself (torch's DCP shards under FSDP2, DeepSpeed's folder): they get
checksums at the commit (read back once, each process a share), and `load_state` verifies them before the library
reads them. A flipped byte is refused in one line on every process, and `automatic_resume` falls back to the
checkpoint before it. Two real processes, launched through `hasten launch`."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from launching import launch

from hasten.checkpoint import engine_checksums


def _line(output: str, word: str) -> str:
    return next(line for line in output.splitlines() if line.startswith(word))


def _flip_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("layout", [
    "fsdp2",
    pytest.param("zero2", marks=pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                                   reason="needs deepspeed (the deepspeed extra)")),
])
def test_a_flipped_byte_in_a_library_written_file_is_refused_and_resume_falls_back(tmp_path, layout):
    root = tmp_path / "run"
    saved = launch("engine_bit_rot.py", root, layout, "save", timeout=300)
    checked = json.loads(_line(saved.stdout, "PASS_FILES").split(" ", 1)[1])
    every = json.loads(_line(saved.stdout, "ALL_FILES").split(" ", 1)[1])
    # the library's own files: DCP shards and metadata, or DeepSpeed's model and optimizer states
    expected = ".distcp" if layout == "fsdp2" else "optim_states.pt"
    assert any(name.endswith(expected) for name in checked), checked
    assert set(checked) <= set(every)
    target = sorted(name for name in checked if name.endswith(expected))[-1]  # a file rank 1 wrote
    newest = root / "checkpoints" / "checkpoint_1"
    _flip_middle(newest / target)

    refused = launch("engine_bit_rot.py", root, layout, "load", timeout=300)
    outcomes = re.findall(r"(REFUSED|LOADED) (\d)(: [^\n]*?older checkpoint)?", refused.stdout)
    assert sorted(f"{word} {rank}" for word, rank, _ in outcomes) == ["REFUSED 0", "REFUSED 1"], refused.stdout
    assert all(target.split("/")[-1] in message and "corrupt" in message for _, _, message in outcomes), outcomes

    resumed = launch("engine_bit_rot.py", root, layout, "resume", timeout=300)
    steps = sorted(re.findall(r"RESUMED \d \d+", resumed.stdout))
    assert steps == ["RESUMED 0 1", "RESUMED 1 1"], resumed.stdout + resumed.stderr  # checkpoint_0's step
    assert "is damaged" in resumed.stderr and "falling back" in resumed.stderr


def test_the_files_are_shared_out_once_each_to_a_process_that_sees_them():
    seen = [["a", "b", "c"], ["a", "b", "c", "d"], ["d"]]
    shares = [engine_checksums._shared_out(seen, rank) for rank in range(3)]
    assert sorted(name for share in shares for name in share) == ["a", "b", "c", "d"]
    assert "d" not in shares[0] and all(set(share) <= set(seen[rank]) for rank, share in enumerate(shares))
