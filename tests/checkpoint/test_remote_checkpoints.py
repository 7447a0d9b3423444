"""save_state / load_state / save_model / automatic_resume with the project in object storage.

In one process on fsspec's `memory://` store; in 2 processes (DDP, FSDP2 sharded, DeepSpeed ZeRO-2, tensor parallel)
on a real S3 API server (moto's server mode on localhost, the tests start it) reached through s3fs as AWS would be:
a run saves to the bucket and exits, a fresh launch resumes from the bucket by itself and ends bit-identical to a run
that was never interrupted."""

from __future__ import annotations

import json
import os

import pytest
import torch

from hasten import Accelerator, ProjectConfiguration
from hasten.checkpoint import remote_checkpoints
from hasten.checkpoint.storage import MANIFEST_NAME, storage_for
from hasten.core.errors import ChecksumError, CheckpointError, ConfigError
from launching import launch


@pytest.fixture(autouse=True)
def fresh_state(tmp_path, monkeypatch):
    from hasten.state import AcceleratorState, GradientState

    monkeypatch.setenv(remote_checkpoints.STAGING_ENV, str(tmp_path / "staging"))
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    from hasten.resilience import preemption

    if preemption._active is not None:
        preemption._active.uninstall()


@pytest.fixture
def memory_url(request):
    import fsspec

    url = "memory://hasten-tests/" + "".join(c if c.isalnum() or c == "_" else "-" for c in request.node.name)
    yield url
    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url, recursive=True)


def _run(url, steps, save=True, async_last=False, **project):
    torch.manual_seed(0)
    accelerator = Accelerator(project_config=ProjectConfiguration(project_dir=url, automatic_checkpoint_naming=True,
                                                                  **project))
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    saved = []
    for step in range(steps):
        model(torch.ones(2, 4) * step).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        if save:
            saved.append(accelerator.save_state(async_save=async_last and step == steps - 1))
    accelerator.wait_for_checkpoint()
    return accelerator, model, optimizer, saved


def test_saves_rotate_in_the_store_and_the_newest_loads_back_exactly(memory_url):
    accelerator, model, optimizer, saved = _run(memory_url, 4, async_last=True, total_limit=2)
    root = f"{memory_url}/checkpoints"
    assert saved == [f"{root}/checkpoint_{i}" for i in range(4)]
    # rotation deleted the oldest only after the newer ones were committed; every kept one is committed
    assert remote_checkpoints.committed_under(root) == [f"{root}/checkpoint_2", f"{root}/checkpoint_3"]
    want = {k: v.clone() for k, v in model.state_dict().items()}
    want_opt = optimizer.state_dict()["state"][0]["exp_avg"].clone()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    accelerator.load_state()  # automatic naming: the newest committed one, from the store
    assert all(torch.equal(model.state_dict()[k], v) for k, v in want.items())
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], want_opt)
    assert accelerator.save_iteration == 4  # numbering continues after what the store holds
    # nothing is left in the staging root: the staged saves and the downloaded copy were removed
    staging = os.environ[remote_checkpoints.STAGING_ENV]
    assert not [f for _, _, files in os.walk(staging) for f in files]


def test_a_checkpoint_is_loaded_only_when_committed_and_a_torn_one_is_ignored(memory_url, caplog):
    import fsspec

    _run(memory_url, 2)
    fs = fsspec.filesystem("memory")
    root = f"{memory_url}/checkpoints"
    # a save that died mid-upload: objects under a version prefix, no manifest
    fs.pipe_file(f"{root}/checkpoint_2/.v-dead/model.safetensors", b"torn")
    assert remote_checkpoints.committed_under(root)[-1] == f"{root}/checkpoint_1"
    assert "uncommitted" in caplog.text
    accelerator, *_ = _run(memory_url, 0, automatic_resume=True)
    assert accelerator.save_iteration == 2  # resumed from checkpoint_1, the newest committed one
    with pytest.raises(CheckpointError, match="not a committed checkpoint"):
        accelerator.load_state(f"{root}/checkpoint_2")
    # the next save into that name removes what the dead save left, then commits
    accelerator.save_state()
    assert not fs.exists(f"{root}/checkpoint_2/.v-dead")
    assert remote_checkpoints.committed_under(root)[-1] == f"{root}/checkpoint_2"


def test_a_byte_changed_in_the_store_is_refused_naming_the_file(memory_url):
    import fsspec

    accelerator, model, *_ = _run(memory_url, 1)
    fs = fsspec.filesystem("memory")
    checkpoint = f"{memory_url}/checkpoints/checkpoint_0"
    manifest = json.loads(fs.cat_file(f"{checkpoint}/{MANIFEST_NAME}"))
    name = f"{checkpoint}/{manifest['objects_under']}/model.safetensors"
    data = bytearray(fs.cat_file(name))
    data[-3] ^= 0x01
    fs.pipe_file(name, bytes(data))
    with pytest.raises(ChecksumError, match="model.safetensors is corrupt"):
        accelerator.load_state(checkpoint)


def test_an_automatically_named_checkpoint_is_never_overwritten(memory_url):
    accelerator, *_ = _run(memory_url, 1)
    accelerator.project_configuration.iteration = 0
    with pytest.raises(ConfigError, match="already exists"):
        accelerator.save_state()


def test_save_model_writes_loadable_shards_and_the_index_to_the_store(memory_url):
    import fsspec
    from safetensors.torch import load

    torch.manual_seed(0)
    accelerator = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    accelerator.save_model(model, f"{memory_url}/model", max_shard_size="20KB")
    fs = fsspec.filesystem("memory")
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{memory_url}/model", detail=False))
    assert "model.safetensors.index.json" in names and len(names) == 3, names
    index = json.loads(fs.cat_file(f"{memory_url}/model/model.safetensors.index.json"))
    loaded = {}
    for shard in set(index["weight_map"].values()):
        loaded.update(load(fs.cat_file(f"{memory_url}/model/{shard}")))
    assert all(torch.equal(loaded[k], v) for k, v in model.state_dict().items())
    # a smaller save into the same place leaves no stale shard behind
    accelerator.save_model(model, f"{memory_url}/model")
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{memory_url}/model", detail=False))
    assert names == ["model.safetensors"], names


# -- two processes on a real S3 API server ----------------------------------------------------------------------
LAYOUTS = {
    "ddp": [],
    "fsdp2": ["--use_fsdp", "--fsdp_version", "2", "--fsdp_state_dict_type", "SHARDED_STATE_DICT"],
    "zero2": [],
    "tp": [],
}


@pytest.fixture(scope="module")
def s3_endpoint():
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_env(s3_endpoint, tmp_path, monkeypatch):
    import s3fs

    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "never-printed-secret",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": s3_endpoint,
           "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent",
           "AWS_EC2_METADATA_DISABLED": "true", remote_checkpoints.STAGING_ENV: str(tmp_path / "staging")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    if not fs.exists("runs"):
        fs.mkdir("runs")
    return env, fs


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_run_saved_to_a_bucket_resumes_from_it_bit_identical(layout, s3_env, tmp_path):
    if layout == "zero2":
        pytest.importorskip("deepspeed")
    env, fs = s3_env
    url = f"s3://runs/{layout}-{os.getpid()}"
    args = dict(flags=LAYOUTS[layout], env=env, timeout=400)
    part = launch("remote_resume.py", url, tmp_path, layout, "full+part", **args)
    assert part.stdout.count("DONE") == 4, part.stdout
    root = f"runs/{layout}-{os.getpid()}/checkpoints"
    kept = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(root, detail=False) if "checkpoint_" in p)
    assert kept == ["checkpoint_1", "checkpoint_2"], kept  # total_limit=2 over 3 saves
    manifest = json.loads(fs.cat_file(f"{root}/checkpoint_2/{MANIFEST_NAME}"))
    stored = {p.split(manifest["objects_under"] + "/", 1)[1] for p in fs.find(f"{root}/checkpoint_2")
              if manifest["objects_under"] + "/" in p}
    assert stored == set(manifest["files"]) and manifest["num_processes"] == 2
    if layout in ("fsdp2", "tp"):
        # a synchronous save wrote its DCP shards straight into the bucket, digested on the way out; fsdp2's last,
        # asynchronous, save (its version prefix opened in the background) staged them, and the commit digested them
        first = json.loads(fs.cat_file(f"{root}/checkpoint_1/{MANIFEST_NAME}"))
        direct = [spec for name, spec in first["checksums"].items() if name.endswith(".distcp")]
        last = [spec for name, spec in manifest["checksums"].items() if name.endswith(".distcp")]
        assert direct and last and not any(s.get("pass") for s in direct), first["checksums"]
        assert all(bool(s.get("pass")) == (layout == "fsdp2") for s in last), manifest["checksums"]
    resumed = launch("remote_resume.py", url, tmp_path, layout, "resume", **args)
    assert "START rank=0 step=3 iteration=3" in resumed.stdout, resumed.stdout
    if layout in ("fsdp2", "tp"):  # sharded (DCP): every rank read its shards from the bucket, none was downloaded
        assert resumed.stdout.count("shard_files_on_disk=0") == 2, resumed.stdout
    full, again = torch.load(tmp_path / "full.pt"), torch.load(tmp_path / "resume.pt")
    assert full.keys() == again.keys() and all(torch.equal(full[k], again[k]) for k in full), layout
    kept = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(root, detail=False, refresh=True) if "checkpoint_" in p)
    assert kept == ["checkpoint_2", "checkpoint_3"], kept  # the resumed run saved (taking the claim over), rotated
    assert env["AWS_SECRET_ACCESS_KEY"] not in part.stdout + part.stderr + resumed.stdout + resumed.stderr


def test_a_relaunch_that_resumed_takes_the_root_over_and_a_stranger_is_refused(memory_url, monkeypatch):
    monkeypatch.setattr(remote_checkpoints, "_continued", set())
    monkeypatch.setenv("HASTEN_RUN_ID", "first-job")
    _run(memory_url, 1)
    monkeypatch.setenv("HASTEN_RUN_ID", "another-job")  # a second job, while the first one's claim is fresh
    stranger = _run(memory_url, 1, save=False)[0]
    stranger.project_configuration.iteration = 5
    with pytest.raises(CheckpointError, match="another run .*first-job.* writes checkpoints to"):
        stranger.save_state()
    # a relaunch that resumed from the root continues the run that wrote it: its saves go on
    accelerator, *_ = _run(memory_url, 0, automatic_resume=True)
    assert accelerator.save_state().endswith("checkpoint_1")


def test_an_asynchronous_save_meets_the_store_in_the_background_and_reports_a_refusal(memory_url, monkeypatch,
                                                                                      tmp_path):
    from hasten.checkpoint import async_save

    monkeypatch.setattr(remote_checkpoints, "_continued", set())
    monkeypatch.setenv("HASTEN_RUN_ID", "first-job")
    _run(memory_url, 1)  # the first save to a root meets the store in the call (a bad bucket is said at once)
    monkeypatch.setenv("HASTEN_RUN_ID", "another-job")
    stranger = _run(memory_url, 1, save=False)[0]
    stranger.project_configuration.iteration = 5
    calls = []
    monkeypatch.setattr(remote_checkpoints, "_begin", lambda *a, _real=remote_checkpoints._begin: calls.append(
        "begin") or _real(*a))
    gate = tmp_path / "gate"  # the background writer waits there, so the call's own requests are what is seen
    monkeypatch.setenv(async_save.GATE_ENV, str(gate))
    stranger.save_state(async_save=True)  # returns before any request to the store: the claim is checked later
    assert calls == []
    gate.touch()
    with pytest.raises(CheckpointError, match="another run .*first-job"):
        stranger.wait_for_checkpoint()
    assert calls == ["begin"]
    root = f"{memory_url}/checkpoints"
    assert remote_checkpoints.committed_under(root) == [f"{root}/checkpoint_0"]  # nothing else committed
    staging = os.environ[remote_checkpoints.STAGING_ENV]
    assert not [f for _, _, files in os.walk(staging) for f in files]  # the staged files were removed


def test_the_staging_dir_setting_is_where_a_save_is_staged(memory_url, tmp_path, monkeypatch):
    monkeypatch.setenv("HASTEN_STAGING_DIR", str(tmp_path / "chosen"))
    place = remote_checkpoints.start_save(f"{memory_url}/ckpt", False, lambda value: value, 0)
    assert place.local_target.startswith(str(tmp_path / "chosen") + os.sep)


@pytest.mark.parametrize("workers", [1, 2])
def test_storage_workers_bound_the_uploads_one_process_runs_at_once(workers, memory_url, monkeypatch):
    import threading

    from hasten.checkpoint.storage.remote import RemoteStorage

    monkeypatch.setenv("HASTEN_STORAGE_WORKERS", str(workers))
    real, lock, active, most, calls = RemoteStorage.upload, threading.Lock(), [0], [0], [0]
    meet = threading.Barrier(2, timeout=60)  # with 2 workers, the first two uploads must run side by side

    def upload(self, local_path, name):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
            calls[0] += 1
            first_two = calls[0] <= 2
        if workers == 2 and first_two:
            meet.wait()
        try:
            return real(self, local_path, name)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(RemoteStorage, "upload", upload)
    # the first save streams its files into the store; the second, asynchronous one opens its version prefix in the
    # background, so it stages its files (model, optimizer and random states) and uploads them at the commit
    _run(memory_url, 2, async_last=True)
    assert calls[0] == 3 and most[0] == workers


def test_a_synchronous_save_streams_its_files_into_the_store_digested_and_uploads_none(memory_url, monkeypatch):
    from hasten.checkpoint.storage import checksum
    from hasten.checkpoint.storage.remote import RemoteStorage

    uploads = []
    monkeypatch.setattr(RemoteStorage, "upload", lambda self, path, name: uploads.append(name))
    accelerator, model, *_ = _run(memory_url, 1)
    assert uploads == []  # nothing was staged on the local disk to be uploaded
    staging = remote_checkpoints.staging_root()
    assert not [f for _, _, files in os.walk(staging) for f in files]
    storage = storage_for(f"{memory_url}/checkpoints")
    manifest = storage.manifest("checkpoint_0")
    assert {"model.safetensors", "optimizer.bin", "random_states_0.pkl"} <= set(manifest["files"])
    for name, size in manifest["files"].items():  # each object's size and digests, taken on the way out, hold
        data = storage.read_object("checkpoint_0", name)
        spec = manifest["checksums"][name]
        assert len(data) == size and "pass" not in spec and "stored" not in spec
        assert spec["digests"] == [checksum.digest([data[i:i + spec["chunk"]]], spec["algorithm"])
                                   for i in range(0, len(data), spec["chunk"])]
    want = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    accelerator.load_state(f"{memory_url}/checkpoints/checkpoint_0")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in want.items())
