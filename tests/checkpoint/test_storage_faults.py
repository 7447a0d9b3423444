"""Checkpoints to S3 through a store that misbehaves: a proxy of the tests' own (s3_fault_proxy.py) between s3fs and
moto's S3 server answers 503 SlowDown, resets connections or stalls for a share of the requests.

A save either commits a checkpoint that loads back bit-identical, or fails in one line naming the object with
nothing committed (the previous checkpoint still loads) -- on one process here, and on two in real processes
(tests/workers/remote_faults.py). botocore's own retries are switched off (`AWS_MAX_ATTEMPTS=1`, a variable AWS
users set too), so what keeps a save alive is hasten's retries and s3fs's.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

sys.path.insert(0, os.path.dirname(__file__))
from s3_fault_proxy import FaultProxy  # noqa: E402

from launching import launch  # noqa: E402

from hasten import Accelerator, ProjectConfiguration  # noqa: E402
from hasten.checkpoint.storage import storage_for  # noqa: E402
from hasten.core.errors import CheckpointError  # noqa: E402

SECRET = "hasten-test-secret-never-printed"
BUCKET = "hasten-faults"


@pytest.fixture(scope="module")
def servers():
    """moto's S3 server and the fault proxy in front of it: (server URL, proxy)."""
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    proxy = FaultProxy(f"http://{host}:{port}").start()
    yield f"http://{host}:{port}", proxy
    proxy.stop()
    server.stop()


def aws_env(endpoint: str) -> dict:
    return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint, "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
            "AWS_CONFIG_FILE": "/nonexistent", "AWS_EC2_METADATA_DISABLED": "true", "AWS_MAX_ATTEMPTS": "1"}


@pytest.fixture
def store(servers, monkeypatch, tmp_path):
    """The client's environment points at the proxy (no faults yet); the bucket exists; a fresh prefix per test."""
    import s3fs

    _, proxy = servers
    for name, value in {**aws_env(proxy.url), "HASTEN_STAGING_DIR": str(tmp_path / "staging")}.items():
        monkeypatch.setenv(name, value)
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    proxy.set(fault=None)
    proxy.reset_counts()
    yield fs, proxy, f"s3://{BUCKET}/{tmp_path.name}"
    proxy.set(fault=None)
    s3fs.S3FileSystem.clear_instance_cache()


def _trained(project_dir: str):
    accelerator = Accelerator(project_config=ProjectConfiguration(project_dir=project_dir,
                                                                  automatic_checkpoint_naming=True, total_limit=2))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    _step(accelerator, model, optimizer)
    return accelerator, model, optimizer


def _step(accelerator, model, optimizer):
    accelerator.backward(model(torch.randn(8, 64)).pow(2).mean())
    optimizer.step()
    optimizer.zero_grad()


def _snapshot(model, optimizer) -> dict:
    state = {f"model.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    for i, per_param in optimizer.state_dict()["state"].items():
        state.update({f"opt.{i}.{k}": torch.as_tensor(v).clone() for k, v in per_param.items()})
    return state


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("fault", ["503", "reset"])
def test_a_share_of_faults_still_commits_and_loads_back_bit_identical(store, fault):
    fs, proxy, root = store
    accelerator, model, optimizer = _trained(root)
    saved = _snapshot(model, optimizer)
    proxy.set(fault=fault, rate=0.3)
    path = accelerator.save_state()
    proxy.set(fault=None)
    assert proxy.faulted[fault] > 0, "the proxy served no fault: the test tested nothing"
    assert storage_for(f"{root}/checkpoints").committed() == ["checkpoint_0"]
    _step(accelerator, model, optimizer)
    assert not _same(_snapshot(model, optimizer), saved)
    accelerator.load_state(path)
    assert _same(_snapshot(model, optimizer), saved)


@pytest.mark.parametrize("which", ["every request", "the uploads"])
def test_a_store_that_never_recovers_fails_in_one_line_and_commits_nothing(store, which):
    fs, proxy, root = store
    accelerator, model, optimizer = _trained(root)
    accelerator.save_state()  # checkpoint_0, whole
    first = _snapshot(model, optimizer)
    _step(accelerator, model, optimizer)
    if which == "every request":
        proxy.set(fault="503", rate=1.0)
    else:  # every upload of the new checkpoint's objects (the claim and the lookups go through)
        proxy.set(fault="503", rate=1.0, methods={"PUT", "POST"}, paths=["checkpoint_1/"])
    with pytest.raises(CheckpointError) as raised:
        accelerator.save_state()
    proxy.set(fault=None)
    message = str(raised.value)
    assert "\n" not in message and SECRET not in message
    # the object, and hasten's attempts: 5 for an upload, twice that for a lookup (a HEAD's 503 has no body, so s3fs
    # does not retry it itself), which is the first request to fail when every request does
    attempts = 10 if which == "every request" else 5
    assert f"s3://{BUCKET}/" in message and f"failed {attempts} time(s)" in message, message
    if which == "the uploads":
        assert "checkpoint_1/.v-" in message and "nothing was committed" in message
    assert storage_for(f"{root}/checkpoints").committed() == ["checkpoint_0"]
    assert accelerator.project_configuration.iteration == 1  # the failed save did not take a number
    accelerator.load_state()  # the newest committed one: checkpoint_0
    assert _same(_snapshot(model, optimizer), first)
    # the store is back: the next save takes the name the failed one left, and commits
    assert accelerator.save_state().endswith("checkpoint_1")
    assert storage_for(f"{root}/checkpoints").committed() == ["checkpoint_0", "checkpoint_1"]


def test_a_stall_longer_than_the_timeout_ends_in_one_line(store, monkeypatch):
    """A request the store never answers is abandoned after the client's read timeout (s3fs's, lowered here so the
    test is short) and retried a bounded number of times; then the save fails in one line. Without AWS_MAX_ATTEMPTS
    (most users), hasten turns botocore's own retries off for the filesystems it makes, so the tries do not stack a
    third layer deep (5 x 5 x 5 requests per object, about 6 minutes at s3fs's 15 s read timeout)."""
    import s3fs

    fs, proxy, root = store
    monkeypatch.delenv("AWS_MAX_ATTEMPTS")  # botocore's default, as most users have it
    monkeypatch.setattr(s3fs.S3FileSystem, "read_timeout", 0.5)
    s3fs.S3FileSystem.clear_instance_cache()
    accelerator, model, optimizer = _trained(root)
    accelerator.save_state()
    proxy.set(fault="stall", rate=1.0, methods={"PUT"}, paths=["checkpoint_1/"], stall_seconds=600)
    with pytest.raises(CheckpointError, match=r"upload of s3://.*checkpoint_1/\.v-\S+ failed \d+ time\(s\)"):
        accelerator.save_state()
    proxy.set(fault=None)
    # bounded in count: hasten's 5 attempts, each at most s3fs's 5, for each object that went up at once
    assert 0 < proxy.faulted["stall"] <= 5 * 5 * 3
    assert storage_for(f"{root}/checkpoints").committed() == ["checkpoint_0"]


@pytest.fixture
def small_parts(monkeypatch):
    """Parts of 5 MiB (S3's smallest; moto checks it), so that an object of a few parts stays small."""
    from hasten.checkpoint.storage import multipart

    monkeypatch.setattr(multipart, "PART_BYTES", 5 * 2**20)
    return multipart


def _write_in_pieces(storage, name: str, data: bytes, piece: int = 1_000_003) -> None:
    writer = storage.open_writer(name)
    for start in range(0, len(data), piece):
        writer.write(data[start:start + piece])
    writer.close()  # a failure aborts the upload by itself


def test_a_large_object_goes_up_in_parts_side_by_side_each_part_retried_through_faults(store, small_parts,
                                                                                       monkeypatch):
    import threading

    fs, proxy, root = store
    storage = storage_for(root)
    storage.parts_in_flight = 2
    real, lock, active, most, tried = small_parts.S3Parts.put, threading.Lock(), [0], [0], set()
    meet = threading.Barrier(2, timeout=60)  # the first two parts must be on the wire at the same time

    def put(self, number, data):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
            first_try = number not in tried  # a retried part does not meet again
            tried.add(number)
        try:
            if number <= 2 and first_try:
                meet.wait()
            return real(self, number, data)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(small_parts.S3Parts, "put", put)
    data = os.urandom(4 * small_parts.PART_BYTES + 12345)  # 5 parts, the last one short
    proxy.set(fault="503", rate=0.3, methods={"PUT"})  # a part is a PUT: about every third answered 503
    _write_in_pieces(storage, "big", data)
    proxy.set(fault=None)
    assert proxy.faulted["503"] > 0, "the proxy served no fault: the test tested nothing"
    assert most[0] == 2  # parts_in_flight bounds the parts going up at once
    assert fs.cat_file(f"{BUCKET}/{tmp_name(root)}/big") == data


def test_a_part_that_never_goes_up_fails_in_one_line_and_leaves_nothing(store, small_parts):
    fs, proxy, root = store
    storage = storage_for(root)
    data = os.urandom(3 * small_parts.PART_BYTES)
    proxy.set(fault="503", rate=1.0, methods={"PUT"}, paths=["partNumber=2"])  # part 2 of the upload only
    with pytest.raises(CheckpointError, match=r"upload of s3://.*/lost \(part 2\) failed 5 time\(s\)") as raised:
        _write_in_pieces(storage, "lost", data)
    proxy.set(fault=None)
    assert "\n" not in str(raised.value) and SECRET not in str(raised.value)
    assert not storage.exists("lost")
    assert not fs.call_s3("list_multipart_uploads", Bucket=BUCKET).get("Uploads")  # the upload was aborted


def tmp_name(root: str) -> str:
    return root.rsplit("/", 1)[1]


@pytest.mark.parametrize("layout", ["ddp", "fsdp2"])  # fsdp2: the DCP shards are streamed straight into the store
def test_two_processes_commit_through_faults_and_fail_alike_when_the_store_is_gone(layout, servers, tmp_path):
    server, proxy = servers
    import s3fs

    fs = s3fs.S3FileSystem(key="testing", secret=SECRET, endpoint_url=server)
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    proxy.set(fault=None)
    proxy.reset_counts()
    env = {**aws_env(proxy.url), "HASTEN_STAGING_DIR": str(tmp_path / "staging"), "FAULT_PROXY": proxy.url}
    flags = ["--use_fsdp", "--fsdp_version", "2", "--fsdp_state_dict_type", "SHARDED_STATE_DICT"] if layout == "fsdp2" else []
    result = launch("remote_faults.py", f"s3://{BUCKET}/two-{tmp_path.name}", flags=flags, env=env, timeout=400)
    reports = [json.loads(line.split(" ", 1)[1]) for line in result.stdout.splitlines()
               if line.startswith("REMOTE_FAULTS ")]
    assert sorted(r["rank"] for r in reports) == [0, 1], result.stdout + result.stderr
    for report in reports:
        assert report["committed_through_faults"] == ["checkpoint_0", "checkpoint_1"]
        assert report["loaded_bit_identical"] is True
        error = report["error"]
        assert error.startswith("CheckpointError: ") and "\n" not in error and "nothing was committed" in error
        assert "checkpoint_2/.v-" in error
    assert reports[0]["error"] == reports[1]["error"]  # the same line on every rank
    refused = {r["refused"] for r in reports}  # rank 0 alone met it; every rank says it (nobody waits forever)
    assert len(refused) == 1 and next(iter(refused)).startswith("CheckpointError: save_state(s3://")
    assert proxy.faulted["503"] > 0 and proxy.faulted["reset"] > 0
    assert SECRET not in result.stdout + result.stderr
