"""Every installed tracker library, in one 2-process launch: the run is read back with the library's own
reader, which must find exactly one run (main process only), the hyperparameters and each value at its step.

A library that is not installed is skipped (`bash scripts/install_trackers.sh` installs them all).
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from hasten.commands.launch import get_free_port
from launching import launch

pytestmark = pytest.mark.slow

LIBRARIES = {
    "tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "aim": "aim", "dvclive": "dvclive",
    "clearml": "clearml", "comet_ml": "comet_ml", "swanlab": "swanlab", "trackio": "trackio", "jsonl": None,
}
INSTALLED = [name for name, module in LIBRARIES.items() if module is None or importlib.util.find_spec(module)]
STEPS = (0, 5, 10)
LOSS = {step: 1.0 / (step + 1) for step in STEPS}
ACCURACY = {step: step / 10 for step in STEPS}
PROJECT = "hasten_project"


def _start_mlflow_server(root: Path):
    port = get_free_port()
    log = open(root / "mlflow_server.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "mlartifacts")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    return server, f"http://127.0.0.1:{port}", log


def _stop(server: subprocess.Popen) -> None:
    # The server runs uvicorn workers in its own process group: end the whole group, bounded.
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=15)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Launch the script once for every installed library; yield (out_dir, result, mlflow_url)."""
    out = tmp_path_factory.mktemp("trackers")
    env = {
        "HOME": str(out / "home"),  # ClearML's offline cache and every library's settings stay inside the test
        "WANDB_MODE": "offline", "WANDB_SILENT": "true",
        "CLEARML_OFFLINE_MODE": "1",
        "COMET_OFFLINE_DIRECTORY": str(out / "comet"),
        "TRACKIO_DIR": str(out / "trackio"),
        "MLFLOW_TRACKING_URI": "", "HF_HUB_OFFLINE": "1",
    }
    (out / "home").mkdir()
    server = url = log = None
    if "mlflow" in INSTALLED:
        server, url, log = _start_mlflow_server(out)
        env.update(MLFLOW_TRACKING_URI=url, TEST_MLFLOW_HEALTH_URL=f"{url}/health")
    else:
        env.pop("MLFLOW_TRACKING_URI")
    try:
        result = launch("tracking_libraries.py", out, ",".join(INSTALLED), env=env, timeout=420)
        (out / "launch.log").write_text(result.stdout + result.stderr)
        yield out, json.loads((out / "result.json").read_text()), url
    finally:
        if server is not None:
            _stop(server)
            log.close()


def _needs(name):
    if name not in INSTALLED:
        pytest.skip(f"{name} is not installed (bash scripts/install_trackers.sh)")


def test_every_installed_tracker_started_on_the_main_process_only(run):
    out, result, _ = run
    assert sorted(result["trackers"]) == sorted(INSTALLED)


def test_tensorboard(run):
    _needs("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    out, _, _ = run
    run_dir = out / "project" / PROJECT
    assert len(glob.glob(str(run_dir / "events.out.tfevents.*"))) == 1
    events = EventAccumulator(str(run_dir))
    events.Reload()
    assert {event.step: event.value for event in events.Scalars("loss")} == pytest.approx(LOSS)
    assert {event.step: event.value for event in events.Scalars("accuracy")} == pytest.approx(ACCURACY)
    # Accelerate's layout (HASTEN_TENSORBOARD_ONE_RUN unset): the nested dict went through add_scalars, one
    # run folder per inner key, and the hyperparameters through add_hparams, into a folder named after the time.
    nested = EventAccumulator(str(run_dir / "eval_f1"))
    nested.Reload()
    assert [(event.step, event.value) for event in nested.Scalars("eval")] == [(10, 0.75)]
    timed = [path for path in run_dir.iterdir() if path.is_dir() and path.name != "eval_f1"]
    assert len(timed) == 2 and sum((path / "hparams.yml").is_file() for path in timed) == 1
    events = EventAccumulator(str(next(path for path in timed if not (path / "hparams.yml").is_file())))
    events.Reload()
    hparams = {}
    for content in events.PluginTagToContent("hparams").values():
        data = plugin_data_pb2.HParamsPluginData.FromString(content)
        if data.HasField("session_start_info"):
            hparams = {key: value.WhichOneof("kind") and getattr(value, value.WhichOneof("kind"))
                       for key, value in data.session_start_info.hparams.items()}
    assert hparams["lr"] == pytest.approx(0.01) and hparams["batch_size"] == 8
    assert hparams["optimizer/name"] == "adamw" and hparams["schedule"] == "cosine"
    assert hparams["scale"] == 0.5 and hparams["weights"] == "[1.0, 2.0]" and hparams["warmup"] == "None"


def _wandb_records(path):
    """Records of a `.wandb` file: wandb's framing (7-byte header, 32 KiB blocks, chunked records) around
    protobuf messages parsed with wandb's own schema."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    position, pending, block = 7, b"", 32768
    while position + 7 <= len(data):
        if block - position % block < 7:
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        if length == 0 and kind == 0:
            break
        pending += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_wandb_offline_run(run):
    _needs("wandb")
    out, _, _ = run
    (run_file,) = glob.glob(str(out / "wandb" / "offline-run-*" / "run-*.wandb"))
    history, config, projects = {}, {}, []
    for record in _wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            projects.append(record.run.project)
        if kind == "history":
            row = {"/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in record.history.item}
            history[row["_step"]] = row
        elif kind in ("config", "run"):
            updates = record.config.update if kind == "config" else record.run.config.update
            config.update({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in updates})
    assert set(projects) == {PROJECT}
    assert sorted(history) == list(STEPS)
    assert {step: row["loss"] for step, row in history.items()} == pytest.approx(LOSS)
    assert {step: row["accuracy"] for step, row in history.items()} == pytest.approx(ACCURACY)
    value = lambda key: config[key]["value"] if isinstance(config[key], dict) and "value" in config[key] else config[key]
    assert value("lr") == 0.01 and value("batch_size") == 8 and value("optimizer") == {"name": "adamw",
                                                                                        "betas": [0.9, 0.999]}
    assert value("weights") == [1.0, 2.0] and value("warmup") is None and value("schedule") == "cosine"


def test_mlflow_against_a_real_server(run):
    _needs("mlflow")
    from mlflow import MlflowClient

    _, result, url = run
    client = MlflowClient(tracking_uri=url)
    experiment = client.get_experiment_by_name(PROJECT)
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.info.run_id == result["mlflow_run_id"] and found.info.status == "FINISHED"
    assert found.info.run_name == "hasten-run"
    params = found.data.params
    assert params["lr"] == "0.01" and params["batch_size"] == "8" and params["optimizer/name"] == "adamw"
    assert params["optimizer/betas"] == "[0.9, 0.999]" and params["warmup"] == "None" and params["scale"] == "0.5"
    for name, expected in (("loss", LOSS), ("accuracy", ACCURACY)):
        history = client.get_metric_history(found.info.run_id, name)
        assert {metric.step: metric.value for metric in history} == pytest.approx(expected)
    assert [(metric.step, metric.value) for metric in client.get_metric_history(found.info.run_id, "eval/f1")] == [
        (10, 0.75)]


def test_aim_repository(run):
    _needs("aim")
    from aim import Repo
    from aim.sdk.index_manager import RepoIndexManager

    out, _, _ = run
    repo_path = str(out / "project")
    repo = Repo(repo_path)
    indexer = RepoIndexManager.get_index_manager(repo)
    for run_hash in repo.list_all_runs():  # a closed run is readable once indexed (`aim up` does this)
        indexer.index(run_hash)
    (aim_run,) = list(Repo(repo_path).iter_runs())
    assert aim_run.name == PROJECT
    hparams = aim_run["hparams"]
    assert hparams["lr"] == 0.01 and hparams["optimizer"] == {"name": "adamw", "betas": [0.9, 0.999]}
    assert hparams["weights"] == [1.0, 2.0] and hparams["warmup"] is None
    metrics = {}
    for metric in aim_run.metrics():
        steps, (values, _epochs, _times) = metric.data.items_list()
        metrics[metric.name] = dict(zip(steps, values))
    assert metrics["loss"] == pytest.approx(LOSS) and metrics["accuracy"] == pytest.approx(ACCURACY)
    assert metrics["eval/f1"] == {10: 0.75} and metrics["eval_loss"] == {10: 0.25}


def test_dvclive_files(run):
    _needs("dvclive")
    from dvclive.serialize import load_yaml
    from dvclive.utils import parse_json, parse_tsv

    out, _, _ = run
    directory = out / "dvclive"
    params = load_yaml(directory / "params.yaml")
    assert params["lr"] == 0.01 and params["optimizer"]["betas"] == [0.9, 0.999] and params["schedule"] == "cosine"
    for name, expected in (("loss", LOSS), ("accuracy", ACCURACY)):
        rows = parse_tsv(directory / "plots" / "metrics" / f"{name}.tsv")
        assert {int(row["step"]): float(row[name]) for row in rows} == pytest.approx(expected)
    assert parse_json(directory / "metrics.json")["loss"] == pytest.approx(LOSS[10])
    assert [row["step"] for row in parse_tsv(directory / "plots" / "metrics" / "eval" / "f1.tsv")] == ["10"]


def test_clearml_offline_session(run):
    _needs("clearml")
    out, result, _ = run
    sessions = glob.glob(str(out / "home" / ".clearml" / "cache" / "offline" / "offline-*[!p]"))
    assert sessions == [result["clearml_folder"]]
    folder = Path(result["clearml_folder"])
    task = json.loads((folder / "task.json").read_text())
    assert task["name"] == PROJECT
    (configuration,) = task["configuration"].values()
    assert "lr = 0.01" in configuration["value"] and "batch_size = 8" in configuration["value"]
    events = [event for line in (folder / "metrics.jsonl").read_text().splitlines() for event in json.loads(line)]
    scalars = [event for event in events if event["type"] == "training_stats_scalar"]
    for name, expected in (("loss", LOSS), ("accuracy", ACCURACY)):
        got = {event["iter"]: event["value"] for event in scalars if (event["metric"], event["variant"]) == (name, "train")}
        assert got == pytest.approx(expected)
    # "eval_loss" is the "eval" line of the "loss" plot; the nested {"eval": {"f1"}} the "eval" line of "f1"
    got = {(event["metric"], event["variant"], event["iter"]): event["value"] for event in scalars}
    assert got[("loss", "eval", 10)] == 0.25 and got[("f1", "eval", 10)] == pytest.approx(0.75)


def test_comet_offline_archive(run):
    _needs("comet_ml")
    out, _, _ = run
    (archive,) = glob.glob(str(out / "comet" / "*.zip"))
    with zipfile.ZipFile(archive) as opened:
        experiment = json.loads(opened.read("experiment.json"))
        messages = [json.loads(line) for line in opened.read("messages.json").decode().splitlines() if line]
    assert experiment["project_name"] == PROJECT
    params = {}
    for message in messages:
        if message["type"] == "parameter_msg":
            param = message["payload"].get("param") or message["payload"].get("params")
            params[param["paramName"]] = param["paramValue"]
    assert params["lr"] == 0.01 and params["batch_size"] == 8 and params["optimizer|name"] == "adamw"
    metrics = [message["payload"]["metric"] for message in messages if message["type"] == "metric_msg"]
    for name, expected in (("loss", LOSS), ("accuracy", ACCURACY)):
        got = {metric["step"]: metric["metricValue"] for metric in metrics if metric["metricName"] == name}
        assert {step: float(value) for step, value in got.items()} == pytest.approx(expected)


def test_swanlab_local_run(run):
    _needs("swanlab")
    import yaml
    from swanlab.proto.swanlab.record.v1 import record_pb2
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    out, _, _ = run
    (run_file,) = glob.glob(str(out / "swanlog" / "run-*" / "run-*.swanlab"))
    reader = DataStoreReader()
    reader.open(run_file)
    scalars, projects = {}, []
    for data in reader:
        record = record_pb2.Record()
        record.ParseFromString(data)
        if record.HasField("start"):
            projects.append(record.start.project)
        if record.HasField("scalar"):
            scalars.setdefault(record.scalar.key, {})[record.scalar.step] = record.scalar.value.number
    reader.close()
    assert set(projects) == {PROJECT}
    assert scalars["loss"] == pytest.approx(LOSS) and scalars["accuracy"] == pytest.approx(ACCURACY)
    config = yaml.safe_load((Path(run_file).parent / "files" / "config.yaml").read_text())
    assert config["lr"]["value"] == 0.01 and config["optimizer"]["value"]["betas"] == [0.9, 0.999]


def test_trackio_local_database(run, monkeypatch):
    _needs("trackio")
    import trackio.sqlite_storage as storage

    out, _, _ = run
    monkeypatch.setattr(storage, "TRACKIO_DIR", out / "trackio")
    (run_name,) = storage.SQLiteStorage.get_runs(PROJECT)
    logs = storage.SQLiteStorage.get_logs(PROJECT, run_name)
    assert {row["step"]: row["loss"] for row in logs if "loss" in row} == pytest.approx(LOSS)
    assert {row["step"]: row["accuracy"] for row in logs if "accuracy" in row} == pytest.approx(ACCURACY)
    (evaluation,) = [row for row in logs if "eval_loss" in row]
    assert evaluation["step"] == 10 and evaluation["eval_loss"] == 0.25
    config = storage.SQLiteStorage.get_run_config(PROJECT, run_name)
    assert config["lr"] == 0.01 and config["optimizer"] == {"name": "adamw", "betas": [0.9, 0.999]}


def test_jsonl(run):
    out, _, _ = run
    run_dir = out / "project" / PROJECT
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [*STEPS, 10]
    assert {line["step"]: line["values"]["loss"] for line in lines[:3]} == pytest.approx(LOSS)
    assert lines[3]["values"] == {"eval_loss": 0.25, "eval": {"f1": 0.75}}
    assert json.loads((run_dir / "config.json").read_text())["weights"] == [1.0, 2.0]
