"""The per-step breakdown (`Accelerator.track_step_times`, a hasten extension): data wait, forward+backward and
optimizer time logged to the trackers every `log_every` steps, hooks absent when off; and, in 2 real processes,
the straggler rank named, each rank's profiler traces and memory files written (one launch for all three)."""

from __future__ import annotations

import json
import time
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from hasten import Accelerator
from hasten.data_loader import DataLoaderShard
from hasten.state import AcceleratorState, GradientState
from hasten.observe.step_timer import StepTimer, summarize
from launching import REPO


@pytest.fixture(autouse=True)
def _fresh_state():
    AcceleratorState._reset_state()
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state()
    GradientState._reset_state()


class SlowData(Dataset):
    def __init__(self, n=24, delay=0.0):
        self.n, self.delay = n, delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.delay)
        return torch.full((4,), float(i)), torch.tensor([float(i)])


def _setup(tmp_path, delay=0.0, **kwargs):
    accelerator = Accelerator(cpu=True, log_with="jsonl", project_dir=str(tmp_path), **kwargs)
    accelerator.init_trackers("run")
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowData(delay=delay), batch_size=2)
    return (accelerator, *accelerator.prepare(model, optimizer, loader))


def _train(accelerator, model, optimizer, loader, epochs=1):
    for _ in range(epochs):
        for x, y in loader:
            with accelerator.accumulate(model):
                accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
                optimizer.step()
                optimizer.zero_grad()


def _logged(tmp_path):
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_off_there_are_no_hooks(tmp_path):
    accelerator, model, optimizer, loader = _setup(tmp_path)
    assert type(loader) is DataLoaderShard
    assert "step" not in vars(optimizer) and "backward" not in vars(accelerator)
    _train(accelerator, model, optimizer, loader)
    accelerator.end_training()
    assert not (tmp_path / "run" / "metrics.jsonl").read_text()


def test_breakdown_is_logged_to_the_tracker_every_interval(tmp_path):
    accelerator, model, optimizer, loader = _setup(tmp_path, delay=0.01)
    with accelerator.track_step_times(log_every=4) as timer:
        assert isinstance(loader, DataLoaderShard) and type(loader) is not DataLoaderShard
        assert "step" in vars(optimizer) and "backward" in vars(accelerator)
        _train(accelerator, model, optimizer, loader, epochs=2)  # 12 batches per epoch
    accelerator.end_training()
    logged = _logged(tmp_path)
    assert [entry["step"] for entry in logged] == [4, 8, 12, 16, 20, 24] and timer.steps == 24
    assert [entry["values"] for entry in logged] == timer.history
    keys = {f"step_breakdown/{k}" for k in ("step_s", "data_wait_s", "forward_backward_s", "optimizer_s")}
    for entry in logged:
        values = entry["values"]
        assert set(values) == keys  # one process: no rank keys
        assert values["step_breakdown/step_s"] == pytest.approx(
            values["step_breakdown/data_wait_s"] + values["step_breakdown/forward_backward_s"]
            + values["step_breakdown/optimizer_s"])
        assert all(values[key] > 0 for key in keys)
    # Each batch of 2 sleeps 2 x 10 ms in the dataset: all 24 batches' sleep is data wait, not compute (the loader
    # reads one batch ahead, so it falls on the first step of each epoch twice and on none of the last).
    assert sum(entry["values"]["step_breakdown/data_wait_s"] * 4 for entry in logged) >= 24 * 0.02
    # stop() takes every hook away; the loader is the same object and still works.
    assert type(loader) is DataLoaderShard and "step" not in vars(optimizer) and "backward" not in vars(accelerator)
    assert "_hasten_step_timer" not in vars(accelerator) and "_hasten_step_timer" not in vars(loader)
    assert len(list(loader)) == 12 and loader.state_dict()["epoch"] == 3  # the passes counted through the swap


def test_accumulation_counts_optimizer_steps_not_batches(tmp_path):
    accelerator, model, optimizer, loader = _setup(tmp_path, gradient_accumulation_steps=3)
    timer = accelerator.track_step_times(log_every=2)
    _train(accelerator, model, optimizer, loader)  # 12 batches, 4 optimizer steps
    timer.stop()
    accelerator.end_training()
    assert timer.steps == 4 and [entry["step"] for entry in _logged(tmp_path)] == [2, 4]


def test_loader_made_later_is_watched_on_request(tmp_path):
    accelerator, model, optimizer, loader = _setup(tmp_path, delay=0.005)
    with accelerator.track_step_times(log_every=2) as timer:
        resumed = accelerator.skip_first_batches(loader, 8)
        timer.watch(resumed)
        _train(accelerator, model, optimizer, resumed)  # 4 batches left
    assert timer.steps == 4 and sum(v["step_breakdown/data_wait_s"] * 2 for v in timer.history) >= 4 * 0.01
    assert "_hasten_step_timer" not in vars(resumed)


def test_misuse_is_refused(tmp_path):
    accelerator = Accelerator(cpu=True)
    with pytest.raises(RuntimeError, match=r"needs a prepared optimizer .* after accelerator.prepare"):
        accelerator.track_step_times()
    accelerator, model, optimizer, loader = _setup(tmp_path)
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="log_every=...\\) must be a positive integer"):
            accelerator.track_step_times(log_every=bad)
    with pytest.raises(ValueError, match="straggler_factor"):
        accelerator.track_step_times(straggler_factor=1)
    with accelerator.track_step_times() as timer:
        with pytest.raises(RuntimeError, match="already timed by another StepTimer; stop"):
            StepTimer(accelerator).start()
        with pytest.raises(RuntimeError, match="this data loader is already timed by another StepTimer"):
            StepTimer(Accelerator(cpu=True)).watch(loader)
        with pytest.raises(TypeError, match="takes prepared data loaders and optimizers, got StepLR"):
            timer.watch(torch.optim.lr_scheduler.StepLR(optimizer, 1))


def test_scheduler_made_after_the_timer_wraps_the_timed_step(tmp_path):
    """torch's LR schedulers wrap `optimizer.step` and need a bound method; the timed step still counts, and
    stop() leaves the scheduler's wrapper in place (the timer's part goes quiet)."""
    accelerator, model, optimizer, loader = _setup(tmp_path)
    timer = accelerator.track_step_times(log_every=3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)  # on the prepared optimizer
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "lr_scheduler.step() before optimizer.step()" warning
        for x, y in loader:
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        timer.stop()
        assert timer.steps == 12 and len(timer.history) == 4
        for x, y in loader:
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            scheduler.step()
    assert timer.steps == 12 and scheduler.get_last_lr() == [0.01 * 0.5 ** 24]


def test_summary_names_the_rank_whose_own_time_stands_out():
    # 3 ranks, 2 steps; columns: step, data wait, backward, optimizer. Rank 2 waits 80 ms for data; under DDP the
    # others wait for it inside backward, so every step lasts as long on every rank.
    records = torch.tensor([
        [[0.10, 0.001, 0.090, 0.005], [0.10, 0.001, 0.090, 0.005]],
        [[0.10, 0.002, 0.088, 0.005], [0.10, 0.001, 0.089, 0.005]],
        [[0.10, 0.080, 0.010, 0.005], [0.10, 0.081, 0.009, 0.005]],
    ], dtype=torch.float64)
    values = summarize(records, straggler_factor=1.5)
    assert values["step_breakdown/straggler_rank"] == 2 and values["step_breakdown/slowest_rank"] == 2
    assert values["step_breakdown/slowest_rank_share"] == 1.0
    assert values["step_breakdown/slowest_rank_data_wait_s"] == pytest.approx(0.0805)
    # Ranks within the factor, or a gap too small to matter: the slowest is named, no straggler.
    even = records.clone()
    even[2] = torch.tensor([[0.10, 0.003, 0.085, 0.005], [0.10, 0.003, 0.085, 0.005]])  # own 15 ms vs 10-11.5
    values = summarize(even, straggler_factor=1.5)
    assert values["step_breakdown/straggler_rank"] == -1 and values["step_breakdown/slowest_rank"] == 2
    tiny = records.clone()
    tiny[..., 0] = 1.0  # long steps: 80 ms of own time is not worth flagging
    tiny[..., 2] += 0.9
    assert summarize(tiny, straggler_factor=1.5)["step_breakdown/straggler_rank"] == -1


def test_two_processes_straggler_profiles_and_memory(tmp_path):
    """One launch: rank 1 sleeps in its data. The tracker's log names rank 1 as the straggler; each rank wrote
    its own Chrome trace, TensorBoard traces (schedule honoured) and memory JSON + PNG."""
    from launching import launch

    launch("observe_run.py", tmp_path)
    logged = _logged(tmp_path)
    assert [entry["step"] for entry in logged] == [4, 8, 12]
    for entry in logged:
        values = entry["values"]
        assert values["step_breakdown/straggler_rank"] == 1 and values["step_breakdown/slowest_rank"] == 1
    # Rank 1 sleeps 2 x 30 ms for each of its 12 batches: the data wait logged for the slowest rank holds it all.
    assert sum(entry["values"]["step_breakdown/slowest_rank_data_wait_s"] * 4 for entry in logged) >= 12 * 0.06
    for rank in (0, 1):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["history"] == [entry["values"] for entry in logged]  # every rank computed the same
        assert report["straggler_warned"] == (rank == 0)  # the warning is printed once, by the main process
        chrome = json.loads((tmp_path / "trace" / f"profile_{rank}.json").read_text())["traceEvents"]
        assert any(e.get("name") == "aten::addmm" for e in chrome)
        steps = report["tensorboard_steps"]  # wait 1, warmup 1, active 2, twice: steps 2-3 and 6-7
        assert steps == [["ProfilerStep#2", "ProfilerStep#3"], ["ProfilerStep#6", "ProfilerStep#7"]]
        memory = json.loads((tmp_path / "memory" / f"memory_rank{rank}.json").read_text())
        assert memory["rank"] == rank and len(memory["samples"]["time_s"]) >= 2
        rss = memory["samples"]["rss_bytes"]
        assert memory["peaks"]["rss_bytes"] - rss[0] >= 0.9 * 256 * 1024 * 1024  # the tensor each rank held
        assert [m["label"] for m in memory["marks"]] == ["training"]
        if report["plotted"]:
            assert (tmp_path / "memory" / f"memory_rank{rank}.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert sorted(p.name for p in (tmp_path / "trace").iterdir()) == ["profile_0.json", "profile_1.json"]


def test_overhead_benchmark_runs():
    """benchmarks/step_breakdown.py at its --quick size prints its table (no timing is checked)."""
    import os
    import subprocess
    import sys

    repo = REPO
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HASTEN_", "ACCELERATE_"))}
    result = subprocess.run([sys.executable, "benchmarks/step_breakdown.py", "--quick"], cwd=repo, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    header, row = [line for line in result.stdout.splitlines() if line.startswith("| ") and "---" not in line][:2]
    assert "hasten + breakdown" in header and row.count(" ms") + row.count(" µs") + row.count(" s |") >= 3
