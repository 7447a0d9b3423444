"""Bad input for checkpoints in object storage, said in one line before training is lost -- at `prepare()` when
ProjectConfiguration.project_dir is a URL, else at the first save_state: a bad URL, a missing bucket, no
credentials, no write permission (moto's IAM simulation denies a user whose policy only reads). The secret key never
appears in a message, nor in what a launched run prints."""

from __future__ import annotations

import json
import logging

import pytest
import torch

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

from launching import launch  # noqa: E402

from hasten import Accelerator, ProjectConfiguration  # noqa: E402
from hasten.core.errors import CheckpointError, ConfigError  # noqa: E402

SECRET = "hasten-test-secret-never-printed"
BUCKET = "hasten-input"
READ_ONLY = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"], "Resource": "*"}]}


@pytest.fixture(scope="module")
def server():
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def aws_env(endpoint: str, key: str = "testing", secret: str = SECRET) -> dict:
    return {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret, "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint, "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
            "AWS_CONFIG_FILE": "/nonexistent", "AWS_EC2_METADATA_DISABLED": "true"}


@pytest.fixture
def s3(server, monkeypatch, tmp_path):
    import s3fs

    for name, value in {**aws_env(server), "HASTEN_STAGING_DIR": str(tmp_path / "staging")}.items():
        monkeypatch.setenv(name, value)
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    yield fs
    s3fs.S3FileSystem.clear_instance_cache()


def _first_save(project_dir=None, output_dir=None):
    """What a training script does up to its first checkpoint. With a URL as project_dir the error comes from
    `prepare()`, before any step (the `trained` list stays empty)."""
    accelerator = Accelerator(project_config=ProjectConfiguration(
        project_dir=project_dir, automatic_checkpoint_naming=project_dir is not None))
    model = accelerator.prepare(torch.nn.Linear(4, 4))
    TRAINED.append(project_dir)
    accelerator.backward(model(torch.randn(2, 4)).sum())
    return accelerator.save_state(output_dir)


TRAINED: list = []  # the project_dirs a test got past prepare() with


@pytest.fixture(autouse=True)
def nothing_trained_yet():
    TRAINED.clear()


def _one_line(error) -> str:
    message = str(error)
    assert "\n" not in message and SECRET not in message, message
    return message


@pytest.mark.parametrize("url, error, words", [
    ("s3:/hasten-input/run", ConfigError, "is not a valid s3:// URL (a slash is missing): write s3://bucket/path"),
    ("s3:hasten-input", ConfigError, "is not a valid s3:// URL"),
    ("nosuchstore://bucket/run", ConfigError, "is not a storage URL hasten can use"),
    ("s3://Not_A_Bucket!/run", CheckpointError, "cannot write checkpoints to s3://Not_A_Bucket!/run/checkpoints: "
                                                "ParamValidationError"),
])
def test_a_bad_url_is_one_line_at_prepare(s3, url, error, words, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error) as raised:
        _first_save(project_dir=url)
    assert words in _one_line(raised.value)
    assert TRAINED == []  # said at prepare(), before any training
    assert not (tmp_path / "s3:").exists()  # a URL typed wrong never becomes a local folder


def test_a_bucket_alone_names_no_checkpoint(s3):
    with pytest.raises(ConfigError, match=r"^s3://hasten-input names no checkpoint inside a bucket: use s3://bucket/"):
        _first_save(output_dir=f"s3://{BUCKET}")


def test_a_missing_bucket_is_one_line_at_prepare_or_at_the_first_save(s3):
    with pytest.raises(CheckpointError) as raised:
        _first_save(project_dir="s3://no-such-bucket-here/run")
    assert _one_line(raised.value).startswith("bucket or container 'no-such-bucket-here' does not exist")
    assert TRAINED == []
    with pytest.raises(CheckpointError) as raised:  # no project_dir: the first save_state(url) says it
        _first_save(output_dir="s3://no-such-bucket-here/run/checkpoint_0")
    assert _one_line(raised.value).startswith("bucket or container 'no-such-bucket-here' does not exist")
    assert TRAINED == [None]


def test_no_credentials_is_one_line(s3, monkeypatch):
    import s3fs

    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(CheckpointError) as raised:
        _first_save(project_dir=f"s3://{BUCKET}/no-credentials")
    assert _one_line(raised.value).startswith(f"no credentials to write checkpoints to s3://{BUCKET}/no-credentials/")
    assert TRAINED == []


@pytest.fixture
def read_only_user(s3, server):
    """An IAM user that may only read, and moto's IAM simulation switched on: (key id, secret)."""
    import boto3
    from moto.core.authorization import enable_iam_authentication

    iam = boto3.client("iam", endpoint_url=server, region_name="us-east-1", aws_access_key_id="testing",
                       aws_secret_access_key=SECRET)
    name = f"reader-{len(iam.list_users()['Users'])}"
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName="read-only", PolicyDocument=json.dumps(READ_ONLY))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    with enable_iam_authentication():
        yield key["AccessKeyId"], key["SecretAccessKey"]


def test_no_write_permission_is_one_line_and_the_secret_is_never_said(read_only_user, monkeypatch):
    import s3fs

    key, secret = read_only_user
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    s3fs.S3FileSystem.clear_instance_cache()
    assert s3fs.S3FileSystem().ls(BUCKET) is not None  # it may read
    with pytest.raises(CheckpointError) as raised:
        _first_save(project_dir=f"s3://{BUCKET}/read-only")
    assert _one_line(raised.value).startswith(f"no permission to write checkpoints to s3://{BUCKET}/read-only/")
    assert secret not in str(raised.value) and TRAINED == []


@pytest.mark.parametrize("case", ["missing bucket", "no permission"])
def test_two_processes_say_it_on_every_rank_and_never_print_the_secret(server, tmp_path, case, request):
    if case == "no permission":
        key, secret = request.getfixturevalue("read_only_user")
        url, words = f"s3://{BUCKET}/launched", "no permission to write checkpoints to"
    else:
        key, secret = "testing", SECRET
        url, words = "s3://no-such-bucket-here/launched", "bucket or container 'no-such-bucket-here' does not exist"
    env = {**aws_env(server, key, secret), "HASTEN_STAGING_DIR": str(tmp_path / "staging")}
    result = launch("remote_first_save.py", url, env=env, check=False, timeout=180)
    printed = result.stdout + result.stderr
    assert result.returncode != 0
    said = [line for line in printed.splitlines() if line.startswith("FIRST_SAVE ")]
    assert len(said) == 2 and all(words in line for line in said), printed  # every rank, one line each
    assert all(line.startswith("FIRST_SAVE prepare CheckpointError: ") for line in said)
    assert secret not in printed
