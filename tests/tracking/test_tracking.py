"""Tracker interface, registry and session, in one process (no tracker library needed)."""

from __future__ import annotations

import enum
import json
import subprocess
import sys
import warnings

import pytest
import torch

from hasten.core.enums import LoggerType
from hasten.state import PartialState
from hasten.tracking import (
    GeneralTracker,
    TrackerError,
    TrackerSession,
    filter_trackers,
    get_available_trackers,
    register_tracker_class,
)
from hasten.tracking import base as tracking_base


class RecordingTracker(GeneralTracker):
    """Writes down every call it receives, in order."""

    name = "recording"
    requires_logging_directory = False

    def __init__(self, run_name=None, **kwargs):
        super().__init__()
        self.calls = [("init", run_name, kwargs)]

    @property
    def tracker(self):
        return self.calls

    def start(self):
        self.calls.append(("start",))

    def store_init_configuration(self, values):
        self.calls.append(("config", values))

    def log(self, values, step=None, **kwargs):
        self.calls.append(("log", values, step, kwargs))

    def finish(self):
        self.calls.append(("finish",))


class FailingTracker(RecordingTracker):
    name = "failing"

    def log(self, values, step=None, **kwargs):
        super().log(values, step, **kwargs)
        raise ConnectionError("server went away")


@pytest.fixture
def state():
    return PartialState(cpu=True)


@pytest.fixture
def registry():
    saved, removed = dict(tracking_base._CUSTOM), set(tracking_base.LOGGER_TYPE_TO_CLASS.removed)
    yield tracking_base._CUSTOM
    tracking_base._CUSTOM.clear()
    tracking_base._CUSTOM.update(saved)
    tracking_base.LOGGER_TYPE_TO_CLASS.removed.clear()
    tracking_base.LOGGER_TYPE_TO_CLASS.removed.update(removed)


def test_importing_tracking_loads_no_tracker_library():
    code = (
        "import sys, hasten, hasten.tracking as t; t.TrackerSession; t.TensorBoardTracker; t.WandBTracker; "
        "t.MLflowTracker; t.AimTracker; t.CometMLTracker; t.ClearMLTracker; t.DVCLiveTracker; "
        "t.SwanLabTracker; t.TrackioTracker; "
        "libs = ['tensorboard', 'wandb', 'mlflow', 'aim', 'comet_ml', 'clearml', 'dvclive', 'swanlab', 'trackio', "
        "'torch.utils.tensorboard']; print([m for m in libs if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_subclass_missing_attributes_is_named():
    class Incomplete(GeneralTracker):
        pass

    with pytest.raises(NotImplementedError, match="`name`, `requires_logging_directory`, `tracker`"):
        Incomplete()

    class NoProperty(GeneralTracker):
        name = "x"
        requires_logging_directory = False

    with pytest.raises(NotImplementedError, match="`tracker`"):
        NoProperty()


def test_blank_tracker_does_nothing():
    blank = GeneralTracker(_blank=True)
    blank.start()
    blank.store_init_configuration({"a": 1})
    assert blank.log({"a": 1}, step=3) is None
    blank.finish()
    assert blank.tracker is None


def test_custom_tracker_receives_the_documented_calls(state):
    tracker = RecordingTracker("given")
    session = TrackerSession(filter_trackers(tracker), None)
    session.start("project", config={"lr": 0.1}, init_kwargs={"recording": {"ignored": True}})
    session.log({"loss": 1.5}, step=7, log_kwargs={"recording": {"commit": False}, "other": {"x": 1}})
    session.log({"loss": 1.0})
    assert session.get("recording") is tracker
    assert session.get("recording", unwrap=True) is tracker.calls
    session.finish()
    assert tracker.calls == [
        ("init", "given", {}),
        ("start",),
        ("config", {"lr": 0.1}),
        ("log", {"loss": 1.5}, 7, {"commit": False}),
        ("log", {"loss": 1.0}, None, {}),
        ("finish",),
    ]
    assert session.trackers == [tracker]  # still listed after end_training, as Accelerate's `trackers` are
    session.finish()  # a second end_training closes nothing twice
    assert tracker.calls[-1] == ("finish",) and tracker.calls.count(("finish",)) == 1


def test_registered_name_is_built_with_project_name_and_init_kwargs(state, registry):
    register_tracker_class(RecordingTracker)
    log_with = filter_trackers(["recording", "recording"], None)
    assert log_with == ["recording"]
    session = TrackerSession(log_with, None)
    session.start("my_project", init_kwargs={"recording": {"entity": "me"}})
    (tracker,) = session.trackers
    assert tracker.calls == [("init", "my_project", {"entity": "me"}), ("start",)]
    session.finish()


def test_logger_type_to_class_is_the_live_registry(state, registry):
    from hasten.tracking import LOGGER_TYPE_TO_CLASS

    snapshot = dict(LOGGER_TYPE_TO_CLASS)
    assert "recording" not in LOGGER_TYPE_TO_CLASS and "tensorboard" in snapshot
    register_tracker_class(RecordingTracker)
    assert LOGGER_TYPE_TO_CLASS["recording"] is RecordingTracker  # registrations show up in it

    class Direct(RecordingTracker):  # the older idiom: writing to the mapping registers the class
        name = "direct"

    LOGGER_TYPE_TO_CLASS["direct"] = Direct
    assert filter_trackers(["direct"], None) == ["direct"]
    session = TrackerSession(["direct"], None)
    session.start("p")
    assert type(session.trackers[0]) is Direct
    session.finish()
    # Emptying it and putting a saved copy back restores exactly what was there.
    LOGGER_TYPE_TO_CLASS.clear()
    assert len(LOGGER_TYPE_TO_CLASS) == 0
    with pytest.raises(ValueError, match="not a known tracker"):
        filter_trackers(["tensorboard"], None)
    assert get_available_trackers() == []
    LOGGER_TYPE_TO_CLASS.update(snapshot)
    assert dict(LOGGER_TYPE_TO_CLASS) == snapshot and tracking_base._CUSTOM == {}


def test_register_rejects_bad_classes_and_warns_on_shadowing(registry):
    with pytest.raises(ValueError, match="GeneralTracker subclass"):
        register_tracker_class(dict)

    class Nameless(GeneralTracker):
        requires_logging_directory = False

    with pytest.raises(ValueError, match="name"):
        register_tracker_class(Nameless)

    class Shadow(RecordingTracker):
        name = "tensorboard"

    with pytest.warns(UserWarning, match="replaces"):
        register_tracker_class(Shadow)


def test_filter_trackers_checks_names_and_logging_dir():
    assert filter_trackers(None) == []
    with pytest.raises(ValueError, match="not a known tracker"):
        filter_trackers("tensorbored")
    with pytest.raises(ValueError, match="log_with entries"):
        filter_trackers([3])
    with pytest.raises(ValueError, match="project_dir"):
        filter_trackers("jsonl", None)
    assert filter_trackers(["jsonl", "jsonl"], "logs") == ["jsonl"]
    instance = RecordingTracker()
    everything = filter_trackers(["all", instance], "logs")
    assert everything == [*get_available_trackers(), instance]
    assert "jsonl" not in everything
    assert all(isinstance(kind, LoggerType) for kind in get_available_trackers())


def test_filter_trackers_drops_a_missing_library_with_its_install_hint(monkeypatch):
    monkeypatch.setitem(tracking_base._BUILTIN, "comet_ml", ("comet", "CometMLTracker", "no_such_lib_x", "comet-ml"))
    with pytest.warns(UserWarning, match=r'pip install "hasten\[comet-ml\]"'):
        assert filter_trackers(["comet_ml"], None) == []
    assert LoggerType.COMETML not in get_available_trackers()


@pytest.mark.parametrize(
    "class_name, extra, library",
    [
        ("TensorBoardTracker", "tensorboard", "tensorboard"),
        ("WandBTracker", "wandb", "wandb"),
        ("MLflowTracker", "mlflow", "mlflow"),
        ("AimTracker", "aim", "aim"),
        ("DVCLiveTracker", "dvclive", "dvclive"),
        ("ClearMLTracker", "clearml", "clearml"),
        ("CometMLTracker", "comet-ml", "comet_ml"),
        ("SwanLabTracker", "swanlab", "swanlab"),
        ("TrackioTracker", "trackio", "trackio"),
    ],
)
def test_missing_library_raises_install_hint_on_start(state, monkeypatch, tmp_path, class_name, extra, library):
    import hasten.tracking as tracking

    monkeypatch.setitem(sys.modules, library, None)  # makes `import <library>` fail
    cls = getattr(tracking, class_name)
    tracker = cls("run", str(tmp_path)) if cls.requires_logging_directory else cls("run")
    with pytest.raises(ImportError, match=rf'pip install "hasten\[{extra}\]"'):
        tracker.start()


def test_a_failing_tracker_raises_the_librarys_exception_by_default(state, monkeypatch):
    # Accelerate's behaviour: accelerator.log lets the library's exception through, unwrapped.
    monkeypatch.delenv("HASTEN_TRACKER_ERRORS", raising=False)
    session = TrackerSession([FailingTracker(), RecordingTracker()], None)
    assert session.on_error == "propagate"
    session.start("p")
    with pytest.raises(ConnectionError, match="server went away"):
        session.log({"loss": 1.0}, step=1)
    session.finish()


def test_a_failing_tracker_warns_once_and_training_goes_on(state, monkeypatch):
    monkeypatch.setenv("HASTEN_TRACKER_ERRORS", "warn")  # the hasten setting tracker_errors
    failing, healthy = FailingTracker(), RecordingTracker()
    session = TrackerSession([failing, healthy], None)
    session.start("p")
    with pytest.warns(RuntimeWarning, match="tracker 'failing' failed to log step 1: ConnectionError: server went away"):
        session.log({"loss": 1.0}, step=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        session.log({"loss": 0.5}, step=2)  # counted, not repeated
    assert [call[2] for call in healthy.calls if call[0] == "log"] == [1, 2]
    with pytest.warns(RuntimeWarning, match="'failing' failed 2 log call"):
        session.finish()
    assert failing.calls[-1] == ("finish",)


def test_a_failing_tracker_raises_when_asked(state, monkeypatch):
    monkeypatch.setenv("HASTEN_TRACKER_ERRORS", "raise")
    session = TrackerSession([FailingTracker()], None)
    session.start("p")
    with pytest.raises(TrackerError, match="'failing' failed to log step 3") as caught:
        session.log({"loss": 1.0}, step=3)
    assert isinstance(caught.value.__cause__, ConnectionError)
    session.finish()
    monkeypatch.setenv("HASTEN_TRACKER_ERRORS", "ignore")
    with pytest.raises(ValueError, match="HASTEN_TRACKER_ERRORS"):
        TrackerSession([], None)


def test_get_tracker_without_and_with_trackers(state):
    session = TrackerSession([], None)
    assert type(session.get("wandb")) is GeneralTracker
    session = TrackerSession([RecordingTracker()], None)
    session.start("p")
    with pytest.raises(ValueError, match="no started tracker is named 'wandb'; started: \\['recording'\\]"):
        session.get(LoggerType.WANDB)
    session.finish()


def test_start_twice_adds_runs_as_accelerate_and_is_an_error_under_strict(state, registry, monkeypatch):
    monkeypatch.delenv("HASTEN_STRICT", raising=False)
    register_tracker_class(RecordingTracker)
    session = TrackerSession(["recording"], None)
    session.start("first", config={"lr": 1})
    first = session.trackers[0]
    session.start("second", config={"lr": 2})
    # Accelerate: the new tracker joins the list; every tracker, the first one too, is started again and
    # given the new config, and log reaches both.
    second = session.trackers[1]
    assert len(session.trackers) == 2 and second is not first
    assert [call[0] for call in first.calls] == ["init", "start", "config", "start", "config"]
    assert first.calls[-1] == ("config", {"lr": 2}) and second.calls[0][1] == "second"
    session.log({"loss": 1.0}, step=3)
    assert first.calls[-1][0] == second.calls[-1][0] == "log"
    session.finish()
    monkeypatch.setenv("HASTEN_STRICT", "1")
    session.start("p")
    with pytest.raises(RuntimeError, match="init_trackers was already called: call end_training"):
        session.start("p")
    session.finish()


def test_start_bad_values_are_clear_errors(state, tmp_path):
    session = TrackerSession([RecordingTracker()], None)
    with pytest.raises(ValueError, match="project_name"):
        session.start(3)
    # None is a project name as in Accelerate (Comet, W&B, MLflow pick their default) unless a tracker names its
    # folder after it.
    session.start(None)
    session.finish()
    folder_tracker = TrackerSession(["jsonl"], str(tmp_path))
    with pytest.raises(ValueError, match="project_name=None.*'jsonl' tracker names its folder"):
        folder_tracker.start(None)
    session.start("p")
    with pytest.raises(TypeError, match="dict"):
        session.log([1, 2])
    session.log({"a": 1}, step=torch.tensor(4))
    assert session.trackers[0].calls[-1][2] == 4
    session.finish()


class Color(enum.Enum):
    RED = "red"


def test_jsonl_tracker_writes_plain_values(state, tmp_path):
    session = TrackerSession(filter_trackers("jsonl", tmp_path), tmp_path)
    config = {"lr": torch.tensor(0.5), "layers": [1, 2], "opt": {"name": "adam", "betas": (0.9, 0.99)},
              "color": Color.RED, "none": None}
    session.start("run", config=config)
    session.log({"loss": torch.tensor(2.0), "name": "a"}, step=3)
    session.finish()
    run = tmp_path / "run"
    assert json.loads((run / "config.json").read_text()) == {
        "lr": 0.5, "layers": [1, 2], "opt": {"name": "adam", "betas": [0.9, 0.99]}, "color": "red", "none": None}
    (line,) = (run / "metrics.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert record["step"] == 3 and record["values"] == {"loss": 2.0, "name": "a"}


def test_value_helpers_never_crash_on_odd_values():
    import numpy as np

    flat = tracking_base.flatten({"a": {"b": torch.ones(2), "c": None}, "d": Color.RED, "e": {}, "f": np.float32(1.5),
                                  "g": object})
    assert flat["a/b"] == [1.0, 1.0] and flat["a/c"] is None and flat["d"] == "red" and flat["e"] == {}
    assert flat["f"] == 1.5 and isinstance(flat["g"], str)
    assert tracking_base.scalar_or_text([1, 2]) == "[1, 2]"
    assert tracking_base.simplify(torch.tensor([3.0])) == 3.0
    assert tracking_base.simplify(np.int64(2)) == 2


def test_unfinished_session_is_closed_at_exit(tmp_path):
    script = (
        "import hasten.tracking as t\n"
        "from hasten.state import PartialState\n"
        "PartialState(cpu=True)\n"
        f"s = t.TrackerSession(t.filter_trackers('jsonl', {str(tmp_path)!r}), {str(tmp_path)!r})\n"
        "s.start('run')\n"
        "s.log({'loss': 1.0}, step=1)\n"
        "orig = t.JSONLinesTracker.finish\n"
        "def finish(self):\n"
        f"    open({str(tmp_path / 'closed')!r}, 'w').close(); orig(self)\n"
        "t.JSONLinesTracker.finish = finish\n"
        "raise RuntimeError('training crashed')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 1 and "training crashed" in result.stderr
    assert (tmp_path / "closed").exists()
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 1


@pytest.mark.parametrize("crash", [False, True], ids=["end_training", "crash"])
def test_two_processes_run_main_only_trackers_on_rank_zero_only(tmp_path, crash):
    """Through the Accelerator in 2 processes; with `crash`, rank 0 raises instead of calling end_training
    and its trackers are still closed (at exit)."""
    from launching import launch

    result = launch("tracking_session.py", tmp_path, *(["crash"] if crash else []), check=not crash)
    if crash:
        assert result.returncode != 0 and "training crashed before end_training" in result.stderr
    rank0 = json.loads((tmp_path / "rank0.json").read_text())
    rank1 = json.loads((tmp_path / "rank1.json").read_text())
    assert rank0["trackers"] == ["decorated", "every_rank", "jsonl", "main_only"]
    assert rank1["trackers"] == ["decorated", "every_rank"]

    def lifecycle(name, steps):
        return [[name, "start"], [name, "config", {"lr": 0.5}],
                *[[name, "log", {"loss": loss}, step] for step, loss in steps], [name, "finish"]]

    def of(rank, name):
        return [call for call in rank["calls"] if call[0] == name]

    both_steps = [(1, 1.0), (2, 0.5)]
    assert of(rank0, "every_rank") == lifecycle("every_rank", both_steps)
    assert of(rank1, "every_rank") == lifecycle("every_rank", both_steps)
    assert of(rank0, "main_only") == lifecycle("main_only", both_steps)
    assert of(rank1, "main_only") == []
    assert of(rank0, "decorated") == lifecycle("decorated", both_steps)
    assert of(rank1, "decorated") == lifecycle("decorated", [(1, 1.0)])  # flipped to main-only before step 2
    # trackers close in reverse order of start
    finishes = [call[0] for call in rank0["calls"] if call[1] == "finish"]
    assert finishes == ["decorated", "main_only", "every_rank"]  # started: every_rank, main_only, decorated
    lines = (tmp_path / "session" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]  # one writer, not two


def test_a_tracker_failing_to_start_closes_those_already_started(state):
    class Broken(RecordingTracker):
        name = "broken"

        def start(self):
            raise ImportError('the library is missing: pip install "hasten[broken]"')

    first, broken, never = RecordingTracker(), Broken(), RecordingTracker()
    session = TrackerSession([first, broken, never], None)
    with pytest.raises(ImportError, match="hasten\\[broken\\]"):
        session.start("p", config={"lr": 1})
    assert first.calls[1:] == [("start",), ("finish",)]
    assert never.calls[1:] == [] and session.trackers == []
    broken.start = lambda: None  # once the cause is fixed, the same session starts
    session.start("p")
    assert [tracker.name for tracker in session.trackers] == ["recording", "broken", "recording"]
    session.finish()


def test_all_without_a_logging_dir_skips_directory_trackers_with_a_warning():
    import hasten.tracking as tracking

    assert set(tracking.LOGGER_TYPE_TO_CLASS) == {kind.value for kind in LoggerType if kind != LoggerType.ALL}
    assert tracking.LOGGER_TYPE_TO_CLASS["comet_ml"].__name__ == "CometMLTracker"
    needs_dir = [kind for kind in get_available_trackers()
                 if tracking.LOGGER_TYPE_TO_CLASS[kind.value].requires_logging_directory]
    if not needs_dir:
        pytest.skip("no installed tracker needs a logging directory")
    with pytest.warns(UserWarning, match="need a logging directory"):
        kept = filter_trackers("all", None)
    assert kept == [kind for kind in get_available_trackers() if kind not in needs_dir]


def test_config_may_be_a_dataclass_or_namespace(state):
    import argparse
    import dataclasses

    @dataclasses.dataclass
    class Hyper:
        lr: float = 0.1
        layers: tuple = (2, 3)

    for config, expected in ((Hyper(), {"lr": 0.1, "layers": (2, 3)}),
                             (argparse.Namespace(lr=0.2), {"lr": 0.2})):
        tracker = RecordingTracker()
        session = TrackerSession([tracker], None)
        session.start("p", config=config)
        assert tracker.calls[2] == ("config", expected)
        session.finish()
    with pytest.raises(ValueError, match="config must be a dict"):
        TrackerSession([RecordingTracker()], None).start("p", config=[1, 2])


def test_tensorboard_layout_is_accelerates_unless_one_run_is_asked(state, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from hasten.tracking import TensorBoardTracker

    def folders(root, one_run):
        if one_run:
            monkeypatch.setenv("HASTEN_TENSORBOARD_ONE_RUN", "1")
        else:
            monkeypatch.delenv("HASTEN_TENSORBOARD_ONE_RUN", raising=False)
        tracker = TensorBoardTracker("proj", root)
        tracker.start()
        tracker.store_init_configuration({"lr": 0.1, "opt": {"name": "adam"}})
        tracker.log({"loss": 1.0, "eval": {"f1": 0.5, "note": "text goes to the run itself"}}, step=2)
        tracker.finish()
        run = root / "proj"
        return sorted(p.name for p in run.iterdir() if p.is_dir()), sorted(p.name for p in run.glob("*.yml"))

    # Accelerate's: add_hparams opens a run folder named after the time, hparams.yml goes into another one,
    # and add_scalars opens one run folder per inner key.
    subfolders, yml = folders(tmp_path / "accelerate", one_run=False)
    assert "eval_f1" in subfolders and yml == []
    timed = [name for name in subfolders if name != "eval_f1"]
    assert len(timed) == 2 and all(float(name) > 0 for name in timed)
    assert any((tmp_path / "accelerate" / "proj" / name / "hparams.yml").is_file() for name in timed)
    # HASTEN_TENSORBOARD_ONE_RUN=1 (the hasten setting tensorboard_one_run): one run folder for the project.
    assert folders(tmp_path / "one_run", one_run=True) == ([], ["hparams.yml"])
