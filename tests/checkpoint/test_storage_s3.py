"""The storage layer on a real S3 API server: moto's server mode on localhost, reached through s3fs exactly as AWS
would be (an endpoint URL and credentials in the environment). No network leaves the machine."""

from __future__ import annotations

import pytest

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

from hasten.checkpoint.storage import storage_for  # noqa: E402
from hasten.checkpoint.storage.base import manifest_for  # noqa: E402
from hasten.checkpoint.storage.base import Written  # noqa: E402
from hasten.core.errors import CheckpointError  # noqa: E402

SECRET = "hasten-test-secret-never-printed"


@pytest.fixture(scope="module")
def s3_server():
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The environment an S3 user has: credentials and the endpoint in variables (no config file, no instance
    role), and a bucket."""
    import s3fs

    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": SECRET,
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": s3_server,
                        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent",
                        "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(name, value)
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    if not fs.exists("hasten-bucket"):
        fs.mkdir("hasten-bucket")
    yield fs
    s3fs.S3FileSystem.clear_instance_cache()


def test_a_checkpoint_commits_and_reads_back_on_s3(s3):
    storage = storage_for("s3://hasten-bucket/run", run_id="job-s3")
    storage.check_writable()
    staging = storage.begin("checkpoint_0", "tok")
    big = bytes(range(256)) * 40_000  # 10 MB: more than one part of a multipart upload in s3fs
    written = [storage.write(f"{staging}/model.safetensors", big), storage.write(f"{staging}/optimizer.bin", b"opt")]
    assert not storage.is_committed("checkpoint_0")
    storage.commit(staging, "checkpoint_0", manifest_for([Written(w.name[len(staging) + 1:], w.size, w.crc32)
                                                         for w in written]))
    assert storage.committed() == ["checkpoint_0"]
    assert storage.read_object("checkpoint_0", "model.safetensors") == big
    assert storage.read(storage.resolve("checkpoint_0", "model.safetensors"), 256, 4) == bytes(range(4))
    # what the manifest says is what the bucket holds
    listed = s3.find("hasten-bucket/run/checkpoint_0")
    assert sum(name.endswith("model.safetensors") for name in listed) == 1


def test_a_missing_bucket_is_one_line_before_any_training(s3):
    with pytest.raises(CheckpointError, match=r"bucket or container 'no-such-bucket' does not exist \(s3://"):
        storage_for("s3://no-such-bucket/run").check_writable()


def test_missing_credentials_are_one_line_and_no_secret_is_ever_printed(s3, monkeypatch):
    import s3fs

    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(CheckpointError, match="no credentials to write checkpoints to s3://hasten-bucket/run") as raised:
        storage_for("s3://hasten-bucket/run").check_writable()
    assert SECRET not in str(raised.value)
    # a URL that carries user information is not repeated with it
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(CheckpointError) as raised:
        storage_for(f"s3://key:{SECRET}@no-such-bucket/run").check_writable()
    assert SECRET not in str(raised.value)
