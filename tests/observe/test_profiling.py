"""`ProfileKwargs` + `Accelerator.profile()` end to end in one process: the Chrome trace, the TensorBoard trace
through `on_trace_ready`, the schedule, and each recording option reaching torch's profiler.
(The two-process run, where each rank writes its own trace, is in tests/observe/test_step_timer.py.)"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from hasten import Accelerator, ProfileKwargs
from hasten.core.errors import ConfigError


def _train_steps(model, steps: int, profiler=None):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        if profiler is not None:
            profiler.step()


def _events(path):
    return json.loads(path.read_text())["traceEvents"]


def _profiler_steps(path):
    return sorted(e["name"] for e in _events(path) if e.get("name", "").startswith("ProfilerStep#"))


def test_chrome_trace_is_written_per_rank_name(tmp_path, monkeypatch):
    handed = []  # activities reach torch's profiler (on a CPU machine its default is the CPU alone: the CPU part)
    real = torch.profiler.profile
    monkeypatch.setattr(torch.profiler, "profile", lambda **kwargs: handed.append(kwargs["activities"]) or real(**kwargs))
    handler = ProfileKwargs(activities=["cpu"], output_trace_dir=str(tmp_path / "t"))
    accelerator = Accelerator(cpu=True, kwargs_handlers=[handler])
    with accelerator.profile() as prof:
        _train_steps(torch.nn.Linear(8, 4), 2)
    assert isinstance(prof, real) and handed == [[torch.profiler.ProfilerActivity.CPU]]
    assert [p.name for p in (tmp_path / "t").iterdir()] == ["profile_0.json"]  # profile_{process_index}.json
    names = {e["name"] for e in _events(tmp_path / "t" / "profile_0.json")}
    assert "aten::addmm" in names and "Optimizer.step#SGD.step" in names


def test_handler_passed_to_profile_wins_over_the_accelerators(tmp_path):
    accelerator = Accelerator(cpu=True, kwargs_handlers=[ProfileKwargs(output_trace_dir=str(tmp_path / "a"))])
    with accelerator.profile(ProfileKwargs(output_trace_dir=str(tmp_path / "b"))):
        torch.randn(4, 4) @ torch.randn(4, 4)
    assert (tmp_path / "b" / "profile_0.json").is_file() and not (tmp_path / "a").exists()
    with Accelerator(cpu=True).profile() as prof:  # defaults: nothing written, the profiler still records
        torch.randn(4, 4) @ torch.randn(4, 4)
    assert any(e.key == "aten::mm" for e in prof.key_averages())


def test_recording_options_reach_torch(tmp_path):
    def run(**options):
        handler = ProfileKwargs(activities=["cpu"], output_trace_dir=str(tmp_path / str(len(options))), **options)
        with Accelerator(cpu=True).profile(handler) as prof:
            _train_steps(torch.nn.Linear(8, 4), 1)
        return prof, _events(tmp_path / str(len(options)) / "profile_0.json")

    plain, plain_events = run()
    options = dict(record_shapes=True, profile_memory=True, with_stack=True, with_flops=True, with_modules=True)
    full, events = run(**options)
    for name, value in options.items():
        assert getattr(full, name) is value and getattr(plain, name) is False, name
    assert full.activities == {torch.profiler.ProfilerActivity.CPU}

    def seen(events):
        return {
            "record_shapes": any("Input Dims" in e.get("args", {}) for e in events),
            "profile_memory": any("Total Allocated" in e.get("args", {}) for e in events),
            "with_stack": any(e.get("cat") == "python_function" for e in events),
            "with_modules": any(e.get("name", "").startswith("nn.Module: Linear") for e in events),
        }

    assert seen(events) == dict.fromkeys(seen(events), True)
    assert seen(plain_events) == dict.fromkeys(seen(plain_events), False)
    assert sum(a.flops for a in full.key_averages()) > 0 == sum(a.flops for a in plain.key_averages())


def test_schedule_is_honoured_and_tensorboard_traces_written(tmp_path):
    """skip 1, then 2 cycles of wait 1 / warmup 1 / active 2: steps 3-4 and 7-8 are recorded, one file each."""
    handler = ProfileKwargs(
        activities=["cpu"], schedule_option=dict(wait=1, warmup=1, active=2, repeat=2, skip_first=1),
        on_trace_ready=torch.profiler.tensorboard_trace_handler(str(tmp_path / "tb"), worker_name="rank0"),
    )
    with Accelerator(cpu=True).profile(handler) as prof:
        _train_steps(torch.nn.Linear(8, 4), 12, prof)
    files = sorted((tmp_path / "tb").iterdir(), key=lambda p: _profiler_steps(p))
    assert [p.name.split(".")[0] for p in files] == ["rank0", "rank0"]
    assert all(p.name.endswith(".pt.trace.json") for p in files)
    assert [_profiler_steps(p) for p in files] == [["ProfilerStep#3", "ProfilerStep#4"],
                                                   ["ProfilerStep#7", "ProfilerStep#8"]]


def test_schedule_with_output_trace_dir_exports_the_last_cycle(tmp_path):
    ready = []
    handler = ProfileKwargs(activities=["cpu"], schedule_option=dict(wait=0, warmup=1, active=2, repeat=3),
                            on_trace_ready=lambda p: ready.append(p.step_num), output_trace_dir=str(tmp_path))
    with Accelerator(cpu=True).profile(handler) as prof:
        _train_steps(torch.nn.Linear(8, 4), 7, prof)
    assert ready == [3, 6, 7]  # torch also hands over the cycle still recording at exit (step 7 only)
    assert _profiler_steps(tmp_path / "profile_0.json") == ["ProfilerStep#7"]


def test_endings_that_crash_accelerate_warn_instead(tmp_path):
    # A saving on_trace_ready plus output_trace_dir: torch refuses to save a trace twice.
    handler = ProfileKwargs(on_trace_ready=torch.profiler.tensorboard_trace_handler(str(tmp_path / "tb")),
                            output_trace_dir=str(tmp_path / "chrome"))
    with pytest.warns(RuntimeWarning, match="on_trace_ready already saved"):
        with Accelerator(cpu=True).profile(handler):
            torch.randn(4, 4) @ torch.randn(4, 4)
    assert len(list((tmp_path / "tb").iterdir())) == 1 and not (tmp_path / "chrome" / "profile_0.json").exists()
    # A block that ends while the schedule still waits: the profiler never started, nothing to export.
    handler = ProfileKwargs(schedule_option=dict(wait=5, warmup=1, active=1), output_trace_dir=str(tmp_path / "n"))
    with pytest.warns(RuntimeWarning, match=r"recorded no step .* after 3 calls to prof.step\(\)"):
        with Accelerator(cpu=True).profile(handler) as prof:
            _train_steps(torch.nn.Linear(8, 4), 3, prof)
    assert list((tmp_path / "n").iterdir()) == []
    # An error in the profiled code is the user's error, with no export attempted.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(KeyError):
            with Accelerator(cpu=True).profile(ProfileKwargs(output_trace_dir=str(tmp_path / "e"))):
                raise KeyError("boom")
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("schedule, message", [
    (dict(wait=1, active=2), r"missing \['warmup'\]"),
    (dict(wait=1, warmup=0, active=0), r"\['active'\] must be a positive integer"),
    (dict(wait=-1, warmup=0, active=1), r"\['wait'\] must be an integer >= 0"),
    (dict(wait=0, warmup=0, active=1, cycles=2), r"unknown keys \['cycles'\]"),
    ([1, 1, 1], "must be a dict"),
])
def test_bad_schedule_is_refused_in_one_line(schedule, message):
    with pytest.raises(ConfigError, match=message) as caught:
        ProfileKwargs(schedule_option=schedule)
    assert isinstance(caught.value, ValueError) and "\n" not in str(caught.value)


def test_unknown_activity_is_refused():
    with pytest.raises(ValueError, match=r"Unknown profiler activity 'tpu'; choose from \[.*'cpu'"):
        ProfileKwargs(activities=["cpu", "tpu"]).build()
