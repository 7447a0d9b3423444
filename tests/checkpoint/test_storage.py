"""The storage layer (hasten/checkpoint/storage/): the same operations and commit rule on a local folder and on an
object store (fsspec's memory:// here; a real S3 API server in test_storage_s3.py)."""

from __future__ import annotations

import json
import logging
import os
import uuid
import zlib

import pytest

from hasten.checkpoint.storage import MANIFEST_NAME, Written, is_remote, storage_for
from hasten.checkpoint.storage.base import manifest_for, with_retries
from hasten.core.errors import CheckpointError, ConfigError

pytest.importorskip("fsspec")


@pytest.fixture(params=["local", "memory"])
def storage(request, tmp_path):
    if request.param == "local":
        return storage_for(str(tmp_path / "run"))
    return storage_for(f"memory://hasten-tests/{uuid.uuid4().hex}")


def _save(storage, checkpoint, objects: dict, token="t1", **fields):
    staging = storage.begin(checkpoint, token)
    written = [storage.write(f"{staging}/{name}", data) for name, data in objects.items()]
    storage.commit(staging, checkpoint, manifest_for([_relative(w, staging) for w in written], **fields))
    return staging


def _relative(written, staging):
    """The object as the manifest names it: relative to the checkpoint, not to its staging name."""
    return Written(written.name[len(staging) + 1:], written.size, written.crc32)


def test_urls_choose_the_storage(tmp_path):
    assert not is_remote(tmp_path) and not is_remote("file:///tmp/x") and is_remote("s3://bucket/run")
    assert type(storage_for(str(tmp_path))).__name__ == "LocalStorage"
    assert type(storage_for("file://" + str(tmp_path))).__name__ == "LocalStorage"
    assert type(storage_for("memory://x/run")).__name__ == "RemoteStorage"


def test_objects_round_trip_with_ranges_listing_and_deletion(storage):
    written = storage.write("a/b/blob.bin", bytearray(b"0123456789"))
    assert (written.size, written.crc32) == (10, f"{zlib.crc32(b'0123456789'):08x}")
    assert storage.read("a/b/blob.bin") == b"0123456789" and storage.read("a/b/blob.bin", 3, 4) == b"3456"
    assert storage.size("a/b/blob.bin") == 10 and storage.exists("a/b/blob.bin")
    assert storage.listdir("a") == ["b"] and storage.listdir("a/b") == ["blob.bin"] and storage.listdir("none") == []
    storage.delete("a")
    assert not storage.exists("a/b/blob.bin") and storage.listdir("a") == []


def test_a_checkpoint_is_real_only_after_its_manifest_and_is_read_back_checked(storage):
    _save(storage, "checkpoint_0", {"model.safetensors": b"weights-0", "optimizer.bin": b"state-0"}, iteration=0)
    assert storage.is_committed("checkpoint_0")
    manifest = storage.manifest("checkpoint_0")
    assert manifest["files"] == {"model.safetensors": 9, "optimizer.bin": 7} and manifest["iteration"] == 0
    assert storage.read_object("checkpoint_0", "model.safetensors") == b"weights-0"
    # a staged, never-committed save is not a checkpoint
    staging = storage.begin("checkpoint_1", "t2")
    storage.write(f"{staging}/model.safetensors", b"weights-1")
    assert not storage.is_committed("checkpoint_1")


def test_a_second_save_of_the_same_name_replaces_the_first_whole(storage):
    _save(storage, "ckpt", {"model.bin": b"old", "extra.bin": b"only-old"})
    staging = storage.begin("ckpt", "t2")
    written = storage.write(f"{staging}/model.bin", b"new!")
    # until the commit, readers see the old checkpoint whole
    assert storage.read_object("ckpt", "model.bin") == b"old"
    storage.commit(staging, "ckpt", manifest_for([_relative(written, staging)]))
    assert storage.read_object("ckpt", "model.bin") == b"new!"
    assert set(storage.manifest("ckpt")["files"]) == {"model.bin"}


def test_an_aborted_save_leaves_the_previous_checkpoint(storage):
    _save(storage, "ckpt", {"model.bin": b"good"})
    staging = storage.begin("ckpt", "t2")
    storage.write(f"{staging}/model.bin", b"half")
    storage.abort(staging, "ckpt")
    assert storage.read_object("ckpt", "model.bin") == b"good"


def test_a_flipped_byte_after_the_commit_is_named(storage):
    staging = _save(storage, "ckpt", {"model.bin": b"abcdef"})
    where = storage.resolve("ckpt", "model.bin")
    assert where.startswith("ckpt/")
    storage.write(where, b"abcdeX")  # bit rot: same size, other bytes
    with pytest.raises(CheckpointError, match="model.bin does not match its checksum"):
        storage.read_object("ckpt", "model.bin")
    storage.write(where, b"abc")
    with pytest.raises(CheckpointError, match="has 3 bytes but 6 were written"):
        storage.read_object("ckpt", "model.bin")
    assert staging


def test_remote_uncommitted_saves_are_ignored_with_one_warning_and_removed_by_the_next_save(caplog):
    storage = storage_for(f"memory://hasten-tests/{uuid.uuid4().hex}")
    _save(storage, "checkpoint_0", {"model.bin": b"0"})
    staging = storage.begin("checkpoint_1", "dead")  # a save that died before its commit
    storage.write(f"{staging}/model.bin", b"1")
    with caplog.at_level(logging.WARNING, logger="hasten.checkpoint.storage.remote"):
        assert storage.committed() == ["checkpoint_0"]
    warnings = [r.message for r in caplog.records if "uncommitted" in r.message]
    assert len(warnings) == 1 and "checkpoint_1" in warnings[0]
    storage.begin("checkpoint_1", "next")  # the next save of that name cleans up first
    assert storage.listdir("checkpoint_1") == []
    # the version a manifest names is kept; others under a committed checkpoint go
    stray = "checkpoint_0/.v-stray"
    storage.write(f"{stray}/model.bin", b"x")
    storage.clean_uncommitted("checkpoint_0")
    assert not storage.exists(stray) and storage.read_object("checkpoint_0", "model.bin") == b"0"


def test_two_runs_writing_to_one_root_are_refused_in_one_line():
    url = f"memory://hasten-tests/{uuid.uuid4().hex}"
    first = storage_for(url, run_id="job-1")
    first.begin("checkpoint_0", "a")
    with pytest.raises(CheckpointError, match=r"another run \(job-1.*writes checkpoints to memory://"):
        storage_for(url, run_id="job-2").begin("checkpoint_0", "b")
    storage_for(url, run_id="job-1").begin("checkpoint_0", "c")  # the same job (a restart) goes on
    storage_for(url, run_id="job-3", claim_ttl=0).begin("checkpoint_0", "d")  # a claim past its time is taken over


def test_transient_failures_are_retried_then_named_in_one_line():
    calls, slept = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("Connection reset by peer")
        return "done"

    transient = lambda error: isinstance(error, ConnectionError)  # noqa: E731
    assert with_retries(flaky, "upload of s3://b/x", is_transient=transient, sleep=slept.append) == "done"
    assert len(calls) == 3 and len(slept) == 2 and slept[1] > 0

    def down():
        raise ConnectionError("503 Service Unavailable")

    with pytest.raises(CheckpointError, match=r"upload of s3://b/x failed 4 time\(s\).*503"):
        with_retries(down, "upload of s3://b/x", is_transient=transient, attempts=4, sleep=lambda s: None)
    with pytest.raises(ValueError):  # not transient: at once
        with_retries(lambda: (_ for _ in ()).throw(ValueError("bad")), "x", is_transient=transient)


def test_bad_urls_and_missing_libraries_are_one_line():
    with pytest.raises(ConfigError, match="not a storage URL hasten can use"):
        storage_for("nosuchprotocol://bucket/run")
    import importlib.util

    if importlib.util.find_spec("gcsfs") is None:  # the test environment has s3fs only
        with pytest.raises(ImportError, match=r'pip install "hasten\[gcs\]"'):
            storage_for("gs://bucket/run")


def test_the_local_commit_is_the_checkpoint_folders_own(tmp_path):
    """A local checkpoint made through the layer is a save_state folder: the same marker, read by the same code."""
    from hasten.checkpoint.storage import marker

    storage = storage_for(str(tmp_path))
    _save(storage, "checkpoint_0", {"model.bin": b"w"}, iteration=0, num_processes=2)
    folder = os.path.join(str(tmp_path), "checkpoint_0")
    assert marker.is_complete(folder) and not [n for n in os.listdir(tmp_path) if n.startswith(".")]
    on_disk = json.loads(open(os.path.join(folder, MANIFEST_NAME)).read())
    assert on_disk["num_processes"] == 2 and on_disk["crc32"]["model.bin"] == storage.manifest("checkpoint_0")["crc32"]["model.bin"]
