"""Asynchronous `save_state(async_save=True)`: staging, the background commit, errors, crashes, resume.

The launched script (tests/workers/async_ckpt.py) does most checks in real processes; the tests here run
one process in-process for what needs no process group.
"""

import glob
import json
import os

import pytest
import torch

from launching import REPO, launch

from hasten import Accelerator, ProjectConfiguration
from hasten.checkpoint import async_save as background
from hasten.backends.base import Backend
from hasten.checkpoint.storage.marker import MARKER_NAME
from hasten.checkpoint.storage.folder import newest_checkpoint
from hasten.core.errors import CheckpointError, ConfigError
from hasten.state import AcceleratorState, GradientState


@pytest.fixture
def accelerator(tmp_path):
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    acc = Accelerator(project_config=ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True))
    yield acc
    background.close()


@pytest.fixture
def gate(accelerator, tmp_path, monkeypatch):
    """gate(variable): hold the writer thread at that test hook until `.touch()`; opened at teardown whatever
    happened (before the `accelerator` fixture waits for the save)."""
    made = []

    def hold(variable):
        path = tmp_path / f"gate-{len(made)}"
        monkeypatch.setenv(variable, str(path))
        made.append(path)
        return path

    yield hold
    for path in made:
        path.touch()


def _train(acc, model, optimizer, steps=1):
    for _ in range(steps):
        acc.backward(model(torch.randn(4, 8)).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()


# -- staging ----------------------------------------------------------------------------------------------------
def test_staging_copies_keeps_aliases_and_reuses_buffers():
    stager = background.Stager()
    shared = torch.arange(6.0)
    state = {"a": shared, "b": shared.view(6), "nested": [{"c": torch.ones(2, 3).t()}], "n": 3, "s": "x",
             "obj": {"set": {1, 2}}}
    stager.begin()
    staged = stager(state, "x")
    stager.end()
    shared.add_(100)  # training goes on changing the source
    assert torch.equal(staged["a"], torch.arange(6.0)) and staged["a"].data_ptr() != shared.data_ptr()
    assert staged["b"].data_ptr() == staged["a"].data_ptr(), "tied tensors must stay tied in the copy"
    assert torch.equal(staged["nested"][0]["c"], torch.ones(3, 2)) and staged["n"] == 3
    assert staged["obj"]["set"] == {1, 2} and staged["obj"]["set"] is not state["obj"]["set"]
    first = staged["a"].data_ptr()
    stager.begin()
    again = stager(state, "x")
    stager.end()
    assert again["a"].data_ptr() == first and torch.equal(again["a"], shared), "the next save reuses the buffer"


# -- one process, in-process ------------------------------------------------------------------------------------
def test_async_save_loads_and_waits(accelerator, tmp_path):
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = accelerator.prepare(model, optimizer)
    _train(accelerator, model, optimizer)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    path = accelerator.save_state(async_save=True)
    assert path.endswith("checkpoint_0") and accelerator.project_configuration.iteration == 1
    _train(accelerator, model, optimizer, 2)
    accelerator.load_state()  # waits for the write, then picks it: the newest complete checkpoint
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    assert os.path.isfile(os.path.join(path, MARKER_NAME)) and not background.in_flight()
    # A synchronous save after an asynchronous one waits for it (no collision of temporary folders).
    accelerator.save_state(async_save=True)
    second = accelerator.save_state()
    assert newest_checkpoint(os.path.dirname(path)) == second and len(os.listdir(os.path.dirname(path))) == 3


def _bn_model(acc):
    """Linear + BatchNorm (whose running statistics a forward changes) with AdamW state, prepared and trained once."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = acc.prepare(model, optimizer)
    _train(acc, model, optimizer)
    return model, optimizer


def _on_disk(path):
    from safetensors.torch import load_file

    optimizer = torch.load(os.path.join(path, "optimizer.bin"), weights_only=True)
    return load_file(os.path.join(path, "model.safetensors")), optimizer


def _same(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def _optimizer_tensors(state_dict: dict) -> dict:
    return {f"{i}.{k}": v.clone() for i, s in state_dict["state"].items() for k, v in s.items()}


def test_step_right_after_the_call_does_not_change_what_is_saved(accelerator, gate):
    """Parameters and optimizer state are copied by the writer thread; the next optimizer step waits for that copy
    (not for the write, which the gate holds) and the files hold the values of the call, BatchNorm's running
    statistics (copied in the call, a forward changes them) included."""
    model, optimizer = _bn_model(accelerator)
    at_call = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer_at_call = _optimizer_tensors(optimizer.state_dict())
    write_gate = gate(background.GATE_ENV)
    path = accelerator.save_state(async_save=True)
    _train(accelerator, model, optimizer)  # forward (running stats), backward, step: all while the write is held
    held = background.in_flight() and not os.path.isfile(os.path.join(path, MARKER_NAME))
    assert held, "the step waited for the write"
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, at_call[k])]
    assert "1.running_mean" in changed and "0.weight" in changed, changed
    write_gate.touch()
    accelerator.wait_for_checkpoint()
    weights, optimizer_state = _on_disk(path)
    assert _same(weights, at_call), "the checkpoint holds values changed after the call"
    assert _same(_optimizer_tensors(optimizer_state), optimizer_at_call)


def test_optimizer_step_waits_for_staging(accelerator, gate):
    """With the writer held before it copies, a step (in another thread) must wait: had it changed the weights,
    the save would fail as a torn copy. Once the writer copies, the step goes on and the save commits."""
    import threading

    model, optimizer = _bn_model(accelerator)
    accelerator.backward(model(torch.randn(4, 8)).pow(2).mean())
    at_call = {k: v.clone() for k, v in model.state_dict().items()}
    stage_gate = gate(background.STAGE_GATE_ENV)
    waited = background.waited_for_staging[0]
    path = accelerator.save_state(async_save=True)
    assert background.staging is not None, "parameters were copied in the call, not by the writer thread"
    stepper = threading.Thread(target=optimizer.step)
    stepper.start()
    stepper.join(0.3)  # time to reach the guard (or, without it, to change the weights)
    assert stepper.is_alive(), "optimizer.step() did not wait for the staging copy"
    stage_gate.touch()
    stepper.join()
    accelerator.wait_for_checkpoint()
    assert background.waited_for_staging[0] > waited and background.staging is None
    assert _same(_on_disk(path)[0], at_call)
    assert not torch.equal(model.state_dict()["0.weight"], at_call["0.weight"]), "the step did not run"


def test_weight_changed_in_place_before_staging_fails_the_save(accelerator, gate, monkeypatch):
    """A weight changed in place between the call and the writer's copy: the save fails with a one-line error
    naming the tensor and the fix, the previous checkpoint stays the newest, and the next save works."""
    model, optimizer = _bn_model(accelerator)
    previous = accelerator.save_state()
    stage_gate = gate(background.STAGE_GATE_ENV)
    failed = accelerator.save_state(async_save=True)
    with torch.no_grad():
        model[0].weight.mul_(2)
    stage_gate.touch()
    with pytest.raises(CheckpointError) as caught:
        accelerator.wait_for_checkpoint()
    message = str(caught.value)
    assert "\n" not in message and "'0.weight' of model.safetensors was changed in place" in message, message
    assert "accelerator.wait_for_checkpoint()" in message and "save synchronously" in message, message
    root = os.path.dirname(previous)
    assert newest_checkpoint(root) == previous and not os.path.exists(failed)
    assert not glob.glob(os.path.join(root, ".*")), os.listdir(root)
    monkeypatch.delenv(background.STAGE_GATE_ENV)
    later = accelerator.save_state(async_save=True)
    accelerator.wait_for_checkpoint()
    assert newest_checkpoint(root) == later and _same(_on_disk(later)[0], model.state_dict())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_state_is_copied_at_the_call(accelerator, gate):
    """Device tensors are copied in the call (non-blocking, into pinned buffers; the writer waits on a CUDA event):
    nothing is left for the step to wait for, and the steps right after the call do not reach the file."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64), torch.nn.Linear(64, 64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    device = next(model.parameters()).device
    assert device.type == "cuda"

    def step():
        accelerator.backward(model(torch.randn(32, 64, device=device)).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()

    step()
    at_call = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    write_gate = gate(background.GATE_ENV)
    path = accelerator.save_state(async_save=True)
    assert background.staging is None, "device tensors were left for the writer thread to copy"
    for _ in range(3):
        step()
    write_gate.touch()
    accelerator.wait_for_checkpoint()
    assert _same(_on_disk(path)[0], at_call)


def test_background_error_is_raised_once_at_the_next_call(accelerator, tmp_path):
    model = torch.nn.Linear(8, 8)
    model = accelerator.prepare(model)

    class Unpicklable:
        def state_dict(self):
            return {"fn": lambda: None}

        def load_state_dict(self, state):
            pass

    accelerator.register_for_checkpointing(Unpicklable())
    path = accelerator.save_state(async_save=True)  # staging works; the pickling in the background fails
    with pytest.raises(CheckpointError, match="custom_checkpoint|pickle"):
        accelerator.wait_for_checkpoint()
    accelerator.wait_for_checkpoint()  # reported once
    assert not os.path.exists(path) and not glob.glob(os.path.join(os.path.dirname(path), ".*"))


def test_backend_with_its_own_files_refuses_async(accelerator, tmp_path):
    class OwnFiles(Backend):
        name = "ownfiles"

        def save_model_and_optimizer(self, folder, models, optimizers, **kwargs):
            return []

    accelerator._backend = OwnFiles(accelerator.state, accelerator.run_plan)
    with pytest.raises(ConfigError, match=r"async_save=True\) is not available with the ownfiles backend"):
        accelerator.save_state(async_save=True)
    assert not os.path.exists(os.path.join(tmp_path, "checkpoints")) or not os.listdir(os.path.join(tmp_path, "checkpoints"))


# -- real processes ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode,processes", [("plain", 1), ("plain", 2), ("fsdp", 2)])
def test_async_checkpoints_in_real_processes(tmp_path, mode, processes):
    """Training goes on during the write (its optimizer steps right after the call); async == sync, bit-identical
    resume; rotation; errors at the next call; a weight changed in place before the writer's copy; a kill in the middle of the background write keeps the previous checkpoint; exit commits."""
    killed = launch("async_ckpt.py", mode, tmp_path, "main", num_processes=processes, timeout=300, check=False)
    out = killed.stdout
    for word in ("ASYNC-WHILE-TRAINING steps done before commit: 3", "ASYNC-EQUALS-SYNC", "ASYNC-ROTATION",
                 "ASYNC-ERROR", "ASYNC-INPLACE"):
        assert out.count(word) == processes, f"{word} missing\n{out}\n{killed.stderr[-3000:]}"
    # Killed by its own writer thread (-9; with several processes, a rank may instead see its peer vanish).
    assert killed.returncode != 0, killed.stderr[-3000:]
    assert out.count("KILL expected during the write of") == processes, out
    ckpts = os.path.join(tmp_path, "checkpoints")
    assert glob.glob(os.path.join(ckpts, ".checkpoint_8.hasten-tmp-*")) and newest_checkpoint(ckpts).endswith("checkpoint_7")

    resumed = launch("async_ckpt.py", mode, tmp_path, "resume", num_processes=processes, timeout=300)
    assert resumed.stdout.count("RESUMED") == processes, resumed.stdout
    with open(os.path.join(tmp_path, "unwaited.json")) as handle:
        unwaited = json.load(handle)
    # The save nobody waited for was committed before the processes ended; the killed one's debris is gone.
    assert newest_checkpoint(ckpts) == unwaited["path"] and unwaited["path"].endswith("checkpoint_8")
    assert sorted(os.listdir(ckpts)) == ["checkpoint_7", "checkpoint_8"], os.listdir(ckpts)
    if mode == "plain":
        from safetensors.torch import load_file

        on_disk = {k.removeprefix("module."): v for k, v in load_file(os.path.join(unwaited["path"], "model.safetensors")).items()}
        expected = torch.load(os.path.join(tmp_path, "unwaited.pt"), weights_only=True)
        assert set(on_disk) == set(expected) and all(torch.equal(on_disk[k], expected[k]) for k in expected)


def test_benchmark_prints_blocking_times(tmp_path):
    """The benchmark runs (tiny, one process) and prints every side; no timing is checked."""
    import subprocess
    import sys

    repo = REPO
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HASTEN_", "ACCELERATE_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(repo), env.get("PYTHONPATH", "")) if p)
    out = subprocess.run([sys.executable, "-m", "benchmarks.async_checkpoint", "--quick", "--size-mb", "2", "--dir",
                          str(tmp_path)], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for side in ("hasten (synchronous)", "hasten async_save=True", "raw torch", "first save"):
        assert f"| {side}" in out.stdout or side in out.stdout, out.stdout
    assert os.listdir(tmp_path) == [], "the benchmark leaves its checkpoints behind"
