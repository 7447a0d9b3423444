"""Issue 41, item 2: bit rot after the commit. Checksums go into the completeness marker while the files are written,
and every read checks them as the bytes come in; auto-resume passes a damaged checkpoint over for the one before."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch

from hasten import Accelerator, ProjectConfiguration
from hasten.checkpoint.storage import checksum, fast_io
from hasten.core.errors import ChecksumError
from hasten.state import AcceleratorState, GradientState


@pytest.fixture
def small_chunks(monkeypatch):
    """4 KiB checksum chunks, so that a small model's files span many chunks and the read requests many borders."""
    monkeypatch.setattr(checksum, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(fast_io, "REQUEST_BYTES", 3 * 4096 + 512)  # requests that end between borders too


def _accelerator(**project):
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    return Accelerator(cpu=True, project_config=ProjectConfiguration(**project))


def _objects(accelerator, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(40, 60), torch.nn.Linear(60, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward(model(torch.randn(4, 40)).sum())
    optimizer.step()
    return model, optimizer


def _marker(folder) -> dict:
    return json.loads((Path(folder) / "hasten_checkpoint.json").read_text())


def _flip(path, position):
    data = bytearray(Path(path).read_bytes())
    data[position] ^= 0x10
    Path(path).write_bytes(bytes(data))


def test_a_flipped_byte_anywhere_in_any_file_is_named_on_load(tmp_path, small_chunks):
    accelerator = _accelerator()
    model, optimizer = _objects(accelerator)
    folder = accelerator.save_state(tmp_path / "ckpt")
    marker = _marker(folder)
    assert set(marker["checksums"]) == set(marker["files"])  # every file hasten wrote has its checksums
    for name, spec in marker["checksums"].items():
        assert spec["chunk"] == 4096 and len(spec["digests"]) == -(-marker["files"][name] // 4096)
    accelerator.load_state(folder)  # whole: loads

    for name, size in sorted(marker["files"].items()):
        # the first byte (a header), the middle, a chunk's first and last byte, the file's last byte
        for position in sorted({0, size // 2, 4096, 4095, size - 1} & set(range(size))):
            original = Path(folder, name).read_bytes()
            _flip(Path(folder, name), position)
            with pytest.raises(ChecksumError, match=rf"checkpoint file .*{name} is corrupt: .*checksum mismatch"):
                accelerator.load_state(folder)
            Path(folder, name).write_bytes(original)
    accelerator.load_state(folder)


def test_files_read_by_the_libraries_readers_are_verified_too(tmp_path, small_chunks):
    accelerator = _accelerator()
    _objects(accelerator)
    folder = accelerator.save_state(tmp_path / "ckpt")
    _flip(Path(folder, "optimizer.bin"), os.path.getsize(Path(folder, "optimizer.bin")) // 2)
    # weights_only=False is torch.load's own path, not the fast reader: it is checked in a pass of its own
    with pytest.raises(ChecksumError, match="optimizer.bin is corrupt"):
        accelerator.load_state(folder, load_kwargs={"weights_only": False})


def test_checkpoints_without_checksums_still_load(tmp_path):
    accelerator = _accelerator()
    model, _ = _objects(accelerator)
    folder = accelerator.save_state(tmp_path / "ckpt")
    marker = _marker(folder)
    del marker["checksums"]  # as older hasten wrote it
    Path(folder, "hasten_checkpoint.json").write_text(json.dumps(marker))
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    accelerator.load_state(folder)
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())


def test_a_crc32_checkpoint_loads_and_is_verified_where_xxhash_is_missing(tmp_path, small_chunks, monkeypatch):
    monkeypatch.setattr(checksum, "ALGORITHM", "crc32")
    monkeypatch.setattr(checksum.Summer.__init__, "__defaults__", ("crc32",))
    accelerator = _accelerator()
    _objects(accelerator)
    folder = accelerator.save_state(tmp_path / "ckpt")
    assert {spec["algorithm"] for spec in _marker(folder)["checksums"].values()} == {"crc32"}
    accelerator.load_state(folder)
    _flip(Path(folder, "model.safetensors"), 5000)
    with pytest.raises(ChecksumError, match="model.safetensors is corrupt"):
        accelerator.load_state(folder)


def test_automatic_resume_falls_back_to_the_checkpoint_before_a_damaged_one(tmp_path, small_chunks, caplog):
    accelerator = _accelerator(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    model, optimizer = _objects(accelerator)
    accelerator.save_state()  # checkpoint_0
    good = {k: v.clone() for k, v in model.state_dict().items()}
    accelerator.backward(model(torch.randn(4, 40)).sum())
    optimizer.step()
    newest = accelerator.save_state()  # checkpoint_1, then damaged on disk
    _flip(Path(newest, "model.safetensors"), os.path.getsize(Path(newest, "model.safetensors")) - 3)

    accelerator = _accelerator(project_dir=str(tmp_path), automatic_checkpoint_naming=True, automatic_resume=True)
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(40, 60), torch.nn.Linear(60, 3))
    with caplog.at_level(logging.WARNING):
        model, _ = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=0.1))  # resumes here
    assert "checkpoint_1 is damaged" in caplog.text and "falling back" in caplog.text
    assert "model.safetensors is corrupt" in caplog.text
    assert all(torch.equal(good[k], v) for k, v in model.state_dict().items())  # checkpoint_0's weights
    assert accelerator.save_iteration == 2  # numbering continues after the damaged one, which stays for a look
    from hasten.resilience import preemption

    if preemption._active is not None:
        preemption._active.uninstall()
