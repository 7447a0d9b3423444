"""save_state / load_state: layout, atomic commit, rotation, safe loading, exact resume."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hasten import Accelerator, ProjectConfiguration
from hasten.checkpoint.storage import fast_io, marker as markers
from hasten.core.errors import CheckpointError, ConfigError, UnsafeCheckpointError
from hasten.state import AcceleratorState, GradientState
from launching import SCRIPTS, launch

HERE = Path(__file__).parent


def _reset():
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def _train_module():
    spec = importlib.util.spec_from_file_location("ckpt_train", SCRIPTS / "ckpt_train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _setup(project_dir=None, total_limit=None, automatic=True):
    accelerator = Accelerator(project_config=ProjectConfiguration(
        project_dir=str(project_dir) if project_dir else None, automatic_checkpoint_naming=automatic,
        total_limit=total_limit))
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    return accelerator, model, optimizer, scheduler


def _step(accelerator, model, optimizer, scheduler):
    accelerator.backward(model(torch.randn(5, 3)).pow(2).mean())
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


class Box:
    def __init__(self, value=None):
        self.value = value

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


# -- layout, naming, rotation -----------------------------------------------------------------------------------
def test_layout_and_round_trip(tmp_path):
    accelerator, model, optimizer, scheduler = _setup(automatic=False)
    box = Box(41)
    accelerator.register_for_checkpointing(box)
    _step(accelerator, model, optimizer, scheduler)
    folder = accelerator.save_state(tmp_path / "ckpt")
    names = set(os.listdir(folder))
    assert names == {"model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl",
                     "custom_checkpoint_0.pkl", "hasten_checkpoint.json"}
    marker = json.loads((Path(folder) / "hasten_checkpoint.json").read_text())
    assert marker["complete"] and marker["files"]["optimizer.bin"] == os.path.getsize(Path(folder) / "optimizer.bin")
    # Every non-tensor file loads with weights_only=True: nothing pickled runs on load.
    for name in ("optimizer.bin", "scheduler.bin", "random_states_0.pkl", "custom_checkpoint_0.pkl"):
        torch.load(Path(folder) / name, weights_only=True)

    saved = {k: v.clone() for k, v in model.state_dict().items()}
    saved_lr, saved_opt = scheduler.get_last_lr(), optimizer.state_dict()["state"][0]["exp_avg"].clone()
    expected_draw = torch.rand(3)
    _step(accelerator, model, optimizer, scheduler)
    box.value = 0
    accelerator.load_state(folder)
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    assert scheduler.get_last_lr() == saved_lr
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], saved_opt)
    assert box.value == 41
    assert torch.equal(torch.rand(3), expected_draw), "torch RNG state was not restored"

    # Saving again over the same folder replaces it whole.
    _step(accelerator, model, optimizer, scheduler)
    assert accelerator.save_state(folder) == folder
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]
    # A crash between moving the old checkpoint aside and moving the new one in is repaired on load.
    os.rename(folder, tmp_path / ".ckpt.hasten-old-0123456789ab")
    accelerator.load_state(folder)
    assert os.listdir(tmp_path) == ["ckpt"]


def test_gradients_are_saved_only_inside_an_accumulation_window(tmp_path):
    # Gradients left after a finished window were applied already: they are not written (under FSDP2 they are
    # sharded tensors no file format here takes). Inside a window they are, so the resume keeps the partial sum.
    _reset()
    accelerator = Accelerator(gradient_accumulation_steps=2)
    model = accelerator.prepare(torch.nn.Linear(3, 2))
    with accelerator.accumulate(model):
        accelerator.backward(model(torch.randn(4, 3)).sum())
    assert not accelerator.sync_gradients and model.weight.grad is not None
    assert "gradients_0.safetensors" in os.listdir(accelerator.save_state(tmp_path / "inside"))
    with accelerator.accumulate(model):
        accelerator.backward(model(torch.randn(4, 3)).sum())
    assert accelerator.sync_gradients and model.weight.grad is not None  # a step with no zero_grad after it
    assert "gradients_0.safetensors" not in os.listdir(accelerator.save_state(tmp_path / "after"))
    _reset()


def test_project_configuration_iteration_is_the_first_automatic_name(tmp_path):
    _reset()
    accelerator = Accelerator(project_config=ProjectConfiguration(project_dir=str(tmp_path),
                                                                  automatic_checkpoint_naming=True, iteration=7))
    accelerator.prepare(torch.nn.Linear(3, 2))
    assert accelerator.save_state().endswith("checkpoint_7") and accelerator.project_configuration.iteration == 8
    _reset()


def test_automatic_naming_rotation_and_iteration(tmp_path):
    accelerator, model, optimizer, scheduler = _setup(tmp_path, total_limit=2)
    for _ in range(4):
        _step(accelerator, model, optimizer, scheduler)
        accelerator.save_state("ignored with automatic naming")
    root = tmp_path / "checkpoints"
    assert sorted(os.listdir(root)) == ["checkpoint_2", "checkpoint_3"]
    assert accelerator.project_configuration.iteration == 4
    newest = {k: v.clone() for k, v in model.state_dict().items()}

    _reset()
    accelerator, model, optimizer, scheduler = _setup(tmp_path, total_limit=2)
    accelerator.load_state()  # no argument: the newest complete checkpoint
    assert all(torch.equal(newest[k], v) for k, v in model.state_dict().items())
    # Unlike Accelerate (quirk Q14), the numbering continues after the loaded checkpoint: no collision.
    assert accelerator.project_configuration.iteration == 4
    assert accelerator.save_state().endswith("checkpoint_4")
    assert sorted(os.listdir(root)) == ["checkpoint_3", "checkpoint_4"]

    # Numeric order, not text order; a half-written (marker-less or damaged) newest folder is skipped.
    os.rename(root / "checkpoint_4", root / "checkpoint_10")
    os.remove(root / "checkpoint_10" / "optimizer.bin")
    assert accelerator.load_state() is None  # falls back to checkpoint_3
    assert accelerator.project_configuration.iteration == 11

    accelerator.project_configuration.iteration = 3
    with pytest.raises(ValueError, match="already exists"):
        accelerator.save_state()


def test_argument_errors(tmp_path):
    accelerator, *_ = _setup(automatic=False)
    with pytest.raises(ConfigError, match="output_dir"):
        accelerator.save_state()
    with pytest.raises(ConfigError, match="input_dir"):
        accelerator.load_state()
    with pytest.raises(ValueError, match="not a directory"):
        accelerator.load_state(tmp_path / "nothing")
    accelerator.project_configuration.automatic_checkpoint_naming = True
    accelerator.project_configuration.set_directories(str(tmp_path))
    # A fresh project has nothing to resume: Accelerate's errors (no folder; an empty one) name the setting that
    # makes it a no-op, automatic_resume=True (issue 17); damaged folders raise either way.
    with pytest.raises(FileNotFoundError, match="automatic_resume=True"):
        accelerator.load_state()
    os.makedirs(tmp_path / "checkpoints")
    with pytest.raises(IndexError, match="no checkpoint in"):
        accelerator.load_state()
    accelerator.project_configuration.automatic_resume = True
    assert accelerator.load_state() is None and accelerator.project_configuration.iteration == 0
    os.makedirs(tmp_path / "checkpoints" / "checkpoint_0")
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        accelerator.load_state()


def test_missing_or_corrupt_file_is_named(tmp_path):
    accelerator, model, optimizer, scheduler = _setup(automatic=False)
    _step(accelerator, model, optimizer, scheduler)
    folder = Path(accelerator.save_state(tmp_path / "a"))

    os.remove(folder / "optimizer.bin")
    with pytest.raises(CheckpointError, match="optimizer.bin is missing"):
        accelerator.load_state(folder)

    folder = Path(accelerator.save_state(tmp_path / "b"))
    with open(folder / "model.safetensors", "r+b") as f:
        f.truncate(10)
    with pytest.raises(CheckpointError, match="model.safetensors .*truncated"):
        accelerator.load_state(folder)

    # Without a marker (as Accelerate writes them) corruption is still caught, and the file named.
    os.remove(folder / "hasten_checkpoint.json")
    with pytest.raises(CheckpointError, match="model.safetensors is corrupt"):
        accelerator.load_state(folder)
    folder = Path(accelerator.save_state(tmp_path / "c"))
    os.remove(folder / "hasten_checkpoint.json")
    (folder / "scheduler.bin").write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match="scheduler.bin is corrupt"):
        accelerator.load_state(folder)


def test_random_states_that_cannot_be_restored_stop_load_state(tmp_path):
    # docs/differences.md: a damaged RNG file raises instead of resuming with the wrong random state.
    accelerator, model, optimizer, scheduler = _setup(automatic=False)
    folder = Path(accelerator.save_state(tmp_path / "a"))
    torch.save({"step": 0, "random_state": "not a state"}, folder / "random_states_0.pkl")
    os.remove(folder / "hasten_checkpoint.json")  # as Accelerate writes them: no marker to check sizes against
    with pytest.raises(CheckpointError, match="random_states_0.pkl"):
        accelerator.load_state(folder)


class _Exploit:
    def __reduce__(self):
        return (os.system, (f"touch {os.environ['HASTEN_EXPLOIT_MARK']}",))


def test_malicious_pickle_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("HASTEN_STRICT", raising=False)
    mark = tmp_path / "pwned"
    monkeypatch.setenv("HASTEN_EXPLOIT_MARK", str(mark))
    accelerator, model, optimizer, scheduler = _setup(automatic=False)
    folder = Path(accelerator.save_state(tmp_path / "ckpt"))
    os.remove(folder / "hasten_checkpoint.json")
    torch.save({"state": _Exploit()}, folder / "optimizer.bin")
    with pytest.raises(UnsafeCheckpointError, match="weights_only"):
        accelerator.load_state(folder)
    assert not mark.exists()

    # A registered object whose state is a non-tensor Python object: loads as in Accelerate (custom files are
    # unpickled with weights_only=False, whatever load_kwargs says); under hasten's strict setting it is refused
    # and loads on opt-in.
    from fractions import Fraction

    box = Box(Fraction(1, 3))
    accelerator.register_for_checkpointing(box)
    folder = Path(accelerator.save_state(tmp_path / "custom"))
    box.value = None
    accelerator.load_state(folder)
    assert box.value == Fraction(1, 3)
    box.value = None
    monkeypatch.setenv("HASTEN_STRICT", "1")
    with pytest.raises(UnsafeCheckpointError, match="custom_checkpoint_0.pkl"):
        accelerator.load_state(folder)
    accelerator.load_state(folder, load_kwargs={"weights_only": False})
    assert box.value == Fraction(1, 3)
    os.remove(folder / "hasten_checkpoint.json")  # the marker's sizes would catch the swap first
    torch.save({"value": _Exploit()}, folder / "custom_checkpoint_0.pkl")
    with pytest.raises(UnsafeCheckpointError, match="custom_checkpoint_0.pkl"):
        accelerator.load_state(folder)
    assert not mark.exists()


def test_hooks_and_overwrite_of_a_shared_folder(tmp_path):
    accelerator, model, optimizer, scheduler = _setup(automatic=False)
    seen = []

    def save_hook(models, weights, output_dir):
        seen.append(("save", len(models), output_dir))
        weights[0] = {k: torch.zeros_like(v) for k, v in weights[0].items()}
        os.makedirs(os.path.join(output_dir, "extra"))  # written into the folder being committed
        with open(os.path.join(output_dir, "extra", "hook.txt"), "w") as f:
            f.write("from the hook")

    def load_hook(models, input_dir):
        seen.append(("load", len(models), input_dir))
        models.pop()  # this hook "loads the model itself": hasten must leave it alone

    save_handle = accelerator.register_save_state_pre_hook(save_hook)
    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / "notes.txt").write_text("user file")  # a folder holding other things keeps them
    accelerator.save_state(folder)
    save_handle.remove()
    saved = fast_io.load_tensors(str(folder / "model.safetensors"))
    assert all(not v.any() for v in saved.values())
    assert (folder / "notes.txt").read_text() == "user file"
    assert (folder / "extra" / "hook.txt").read_text() == "from the hook"
    assert "extra/hook.txt" in json.loads((folder / "hasten_checkpoint.json").read_text())["files"]

    # Saving again into it: still merged in (never replaced whole), so the user's file survives.
    accelerator.save_state(folder)
    assert (folder / "notes.txt").read_text() == "user file"

    accelerator.register_load_state_pre_hook(load_hook)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    accelerator.load_state(folder)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert [s[0] for s in seen] == ["save", "load"]


def test_a_failing_save_leaves_nothing_behind(tmp_path):
    accelerator, *_ = _setup(automatic=False)
    box = Box(1)
    accelerator.register_for_checkpointing(box)
    first = accelerator.save_state(tmp_path / "ckpt")
    box.state_dict = lambda: 1 / 0
    with pytest.raises(CheckpointError, match="ZeroDivisionError"):
        accelerator.save_state(tmp_path / "ckpt")
    assert os.listdir(tmp_path) == ["ckpt"]  # no temporary folder left, the old checkpoint intact
    assert markers.is_complete(first)


def test_custom_object_count_must_match(tmp_path):
    accelerator, *_ = _setup(automatic=False)
    accelerator.register_for_checkpointing(Box(1))
    folder = accelerator.save_state(tmp_path / "x")
    accelerator._custom_objects.append(Box(2))
    with pytest.raises(RuntimeError, match="1 custom_checkpoint"):
        accelerator.load_state(folder)


# -- crashes ----------------------------------------------------------------------------------------------------
def test_killed_at_every_point_of_a_save_leaves_a_loadable_checkpoint(tmp_path):
    """SIGKILL before, in the middle of (file cut short) and after every file write and every commit step."""
    result = subprocess.run([sys.executable, str(SCRIPTS / "ckpt_crash.py"), str(tmp_path), "--all"],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    for mode in ("automatic", "fixed"):  # new folder per save / every save replaces the same folder
        trials = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"mode": "' + mode)]
        assert len(trials) >= 15, result.stdout
        assert [t["status"] for t in trials[:-1]] == ["killed"] * (len(trials) - 1), result.stdout + result.stderr
        assert trials[-1]["status"] == "ok", result.stdout + result.stderr
        for t in trials:
            assert t["broken"] == [], t  # nothing visible is ever a partial checkpoint
            assert all(name.startswith(".") for name in t["hidden"])
        assert trials[-1]["hidden"] == []  # stale temporary folders were cleaned up by the next save
        # Every trial after the first loaded the newest complete checkpoint: the counter never goes back.
        loaded = [int(v) for v in (tmp_path / mode / "loaded_0.log").read_text().split()]
        assert len(loaded) == len(trials) and loaded == sorted(loaded) and loaded[-1] >= 1


def test_killed_during_a_two_process_save(tmp_path):
    # checkpoint_0 comes from one process (no `module.` prefix, no random_states_1.pkl): resuming on a
    # different number of processes works too.
    spec = importlib.util.spec_from_file_location("ckpt_crash", SCRIPTS / "ckpt_crash.py")
    crash = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(crash)
    crash.trial(str(tmp_path))
    _reset()
    # rank 1 dies in the middle of its own file (nothing committed); rank 0 dies right after the rename
    # (committed, but rank 1 never hears of it). The one-process test covers every other point.
    for rank, point in ((1, 2), (0, 20)):
        result = launch("ckpt_crash.py", tmp_path, check=False,
                        env={"HASTEN_TEST_CRASH_AT": str(point), "HASTEN_TEST_CRASH_RANK": str(rank)})
        assert result.returncode != 0, result.stdout
        assert "LOADED" in result.stdout, result.stdout + result.stderr
    root = tmp_path / "checkpoints"
    assert sorted(n for n in os.listdir(root) if not n.startswith(".")) == ["checkpoint_0", "checkpoint_1"]
    marker = json.loads((root / "checkpoint_1" / "hasten_checkpoint.json").read_text())
    assert {"random_states_0.pkl", "random_states_1.pkl"} <= set(marker["files"])
    for rank in (0, 1):
        assert (tmp_path / f"loaded_{rank}.log").read_text().split() == ["0", "0"]
    accelerator = Accelerator(project_config=ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True))
    model = accelerator.prepare(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)))
    counter = Box()
    accelerator.register_for_checkpointing(counter)
    accelerator.load_state()
    assert counter.value == 1 and all(torch.all(p == 1) for p in model.parameters())


def test_a_rank_frozen_during_a_two_process_save(tmp_path):
    """Rank 1 freezes (SIGSTOP) in the middle of its own file: under debug mode, rank 0 learns at the collective
    timeout that rank 1 stopped answering inside save_state; the run ends; nothing half-written is taken for a
    checkpoint and the next run loads the previous one."""
    spec = importlib.util.spec_from_file_location("ckpt_crash", SCRIPTS / "ckpt_crash.py")
    crash = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(crash)
    crash.trial(str(tmp_path))  # checkpoint_0, from one process
    _reset()
    result = launch("ckpt_crash.py", tmp_path, check=False, flags=["--debug"], timeout=300,
                    env={"HASTEN_TEST_CRASH_AT": "2", "HASTEN_TEST_CRASH_RANK": "1", "HASTEN_TEST_CRASH_SIGNAL": "SIGSTOP",
                         "HASTEN_COLLECTIVE_TIMEOUT": "10", "HASTEN_HANG_DOCTOR_WAIT": "1"})
    assert result.returncode != 0 and "LOADED 0 on rank 1" in result.stdout, result.stdout + result.stderr
    summary = [line for line in result.stderr.splitlines() if line.startswith("hasten launch:")]
    assert len(summary) == 1 and "rank 1 stopped answering: its process" in summary[0], result.stderr[-3000:]
    assert "is stopped, alive but not running" in summary[0] and "last seen" in summary[0], summary[0]
    root = tmp_path / "checkpoints"
    assert sorted(n for n in os.listdir(root) if not n.startswith(".")) == ["checkpoint_0"]
    again = launch("ckpt_crash.py", tmp_path, timeout=300)  # loads checkpoint_0, saves checkpoint_1 whole
    assert "LOADED 0 on rank 0" in again.stdout and "LOADED 0 on rank 1" in again.stdout, again.stdout
    assert sorted(os.listdir(root)) == ["checkpoint_0", "checkpoint_1"]  # the frozen save's folder is gone too


# -- exact resume -----------------------------------------------------------------------------------------------
def _final(workdir, rank=0):
    return torch.load(Path(workdir) / f"final_{rank}.pt")


def _assert_identical(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs by {(a[key] - b[key]).abs().max()}"


# loader (tests/workers/ckpt_train.py): "manual" indexes the data itself; "prepared" iterates the prepared loader
# again after load_state (use_stateful_dataloader=True resumes it); "skip", "skipfirst" and "continue" are the
# scripts that skip the done batches by hand after load_state (Accelerate's skip_first_batches idiom with and
# without use_seedable_sampler, diffusers' `continue` loop): load_state must not move their loader as well.
@pytest.mark.parametrize("loader,accum,stop", [
    ("manual", 1, 7), ("manual", 3, 8), ("prepared", 1, 7), ("prepared", 3, 17), ("skip", 1, 7), ("skip", 3, 8),
    ("skipfirst", 3, 17), ("continue", 1, 7),
])
def test_exact_resume_one_process(tmp_path, loader, accum, stop):
    """Stopped after micro-step `stop` (mid-epoch; with accum=3, mid-window) and resumed: bit-identical weights."""
    train = _train_module()
    train.run(str(tmp_path / "full"), 30, accum=accum, loader=loader)
    _reset()
    train.run(str(tmp_path / "split"), 30, stop_after=stop, accum=accum, loader=loader)
    _reset()
    train.run(str(tmp_path / "split"), 30, resume=True, accum=accum, loader=loader)
    _assert_identical(_final(tmp_path / "full"), _final(tmp_path / "split"))


def test_exact_resume_two_processes(tmp_path):
    # 6 batches per process and epoch: stopping after 8 is mid-epoch 1 and mid-window for accum=3.
    jobs = [("manual", 1, 7), ("manual", 3, 8), ("prepared", 3, 8), ("skip", 3, 8), ("skipfirst", 3, 8),
            ("continue", 1, 9)]
    first = [f"{tmp_path}/full-{l}{a}:20:0:0:{a}:{l}" for l, a, _ in jobs]
    first += [f"{tmp_path}/split-{l}{a}:20:{s}:0:{a}:{l}" for l, a, s in jobs]
    launch("ckpt_train.py", *first)
    launch("ckpt_train.py", *[f"{tmp_path}/split-{l}{a}:20:0:1:{a}:{l}" for l, a, _ in jobs])
    for loader, accum, _ in jobs:
        for rank in (0, 1):
            _assert_identical(_final(tmp_path / f"full-{loader}{accum}", rank),
                              _final(tmp_path / f"split-{loader}{accum}", rank))


# -- save_model / load_checkpoint_in_model ----------------------------------------------------------------------
class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 20)
        self.body = torch.nn.Sequential(*[torch.nn.Linear(20, 20) for _ in range(4)])
        self.head = torch.nn.Linear(20, 50, bias=False)
        self.head.weight = self.embed.weight  # tied: stored once


def test_parse_size():
    from hasten.checkpoint.state_dicts import parse_size

    assert parse_size("5MB") == 5 * 10**6
    assert parse_size("5MiB") == 5 * 2**20
    assert parse_size("10GB") == 10**10
    assert parse_size("1.5kb") == 1500
    assert parse_size(1234) == 1234
    for bad in ("ten", "5XB", 0, -1, True):
        with pytest.raises(ConfigError, match="max_shard_size"):
            parse_size(bad)


def test_save_model_shards_and_loads_back(tmp_path):
    from safetensors import safe_open

    from hasten import load_checkpoint_in_model
    from hasten.utils import load_checkpoint_in_model as from_utils

    assert from_utils is load_checkpoint_in_model
    accelerator = Accelerator()
    model = accelerator.prepare(Tied())
    (tmp_path / "model-00009-of-00009.safetensors").write_text("stale shard from an earlier save")
    accelerator.save_model(model, tmp_path, max_shard_size="4KB")
    index_text = (tmp_path / "model.safetensors.index.json").read_text()
    index = json.loads(index_text)
    assert index_text == json.dumps(index, indent=2, sort_keys=True) + "\n"
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith(".safetensors")) == shards  # stale one removed
    assert "head.weight" not in index["weight_map"]  # the tied alias is stored once
    total, names = 0, set()
    for shard in shards:
        with safe_open(str(tmp_path / shard), framework="pt") as f:
            assert f.metadata() == {"format": "pt"}
            for key in f.keys():
                assert index["weight_map"][key] == shard
                tensor = f.get_tensor(key)
                total += tensor.numel() * tensor.element_size()
                names.add(key)
    assert total == index["metadata"]["total_size"] and names == set(index["weight_map"])

    fresh = Tied()
    load_checkpoint_in_model(fresh, str(tmp_path))
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))
    assert fresh.head.weight is fresh.embed.weight

    # One shard: a single model.safetensors, no index; the old shards and index are removed.
    accelerator.save_model(model, tmp_path, max_shard_size="10GB")
    assert sorted(n for n in os.listdir(tmp_path)) == ["model.safetensors"]
    fresh = Tied()
    load_checkpoint_in_model(fresh, str(tmp_path / "model.safetensors"), strict=True)
    assert torch.equal(fresh.body[0].weight, model.body[0].weight)

    # Pickle-free .bin shards too, loaded with weights_only.
    accelerator.save_model(model, tmp_path / "bin", max_shard_size=4000, safe_serialization=False)
    assert (tmp_path / "bin" / "pytorch_model.bin.index.json").is_file()
    fresh = Tied()
    load_checkpoint_in_model(fresh, str(tmp_path / "bin" / "pytorch_model.bin.index.json"))
    assert torch.equal(fresh.body[3].bias, model.body[3].bias)


def test_checkpoints_move_between_hasten_and_accelerate(tmp_path):
    accelerate = pytest.importorskip("accelerate")

    def build(module):
        accelerator = module.Accelerator()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
        box = Box(0)
        accelerator.register_for_checkpointing(box)
        return accelerator, model, optimizer, scheduler, box

    import hasten

    for writer, reader in ((hasten, accelerate), (accelerate, hasten)):
        accelerator, model, optimizer, scheduler, box = build(writer)
        _step(accelerator, model, optimizer, scheduler)
        box.value = 5
        folder = str(tmp_path / writer.__name__)
        accelerator.save_state(folder)
        expected = {k: v.clone() for k, v in model.state_dict().items()}
        expected_lr, expected_draw = scheduler.get_last_lr(), torch.rand(4)

        accelerator, model, optimizer, scheduler, box = build(reader)
        accelerator.load_state(folder)  # Accelerate's RNG file holds a NumPy array: allowed, still weights_only
        assert all(torch.equal(expected[k], v) for k, v in model.state_dict().items()), writer.__name__
        assert scheduler.get_last_lr() == expected_lr and box.value == 5
        assert optimizer.state_dict()["state"][0]["step"] == 1
        assert torch.equal(torch.rand(4), expected_draw)


def test_scaler_and_loader_position_are_saved(tmp_path):
    accelerator = Accelerator(mixed_precision="fp16")
    if accelerator.scaler is None:
        pytest.skip("no gradient scaler on this device")
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.arange(20.0).unsqueeze(1).repeat(1, 3), batch_size=4, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    batches, seen = iter(loader), []
    for _ in range(2):
        seen.append(next(batches))
        with accelerator.autocast():
            accelerator.backward(model(seen[-1]).float().pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
    accelerator.scaler.update(1234.0)
    folder = Path(accelerator.save_state(tmp_path / "ckpt"))
    rest = [b.clone() for b in batches]
    assert {"scaler.pt", "sampler.bin"} <= set(os.listdir(folder))
    assert torch.load(folder / "sampler.bin", weights_only=True)["batches_yielded"] == 2

    accelerator.scaler.update(1.0)
    accelerator.load_state(folder)
    assert accelerator.scaler.get_scale() == 1234.0
    # As in Accelerate, a script's load_state leaves the position alone (the script skips by hand); hasten still
    # replays the saved epoch's order, so the skipped batches are the ones that were trained on.
    replayed = list(loader)
    assert len(replayed) == len(seen + rest) and all(torch.equal(a, b) for a, b in zip(replayed, seen + rest))
    accelerator._load_state(folder, loader_positions=True)  # automatic resume's load: continue mid-epoch
    resumed = list(loader)  # the next pass continues at the first unseen batch, same order
    assert len(resumed) == len(rest) and all(torch.equal(a, b) for a, b in zip(resumed, rest))


# -- keywords of save_state / load_state: honoured or refused ---------------------------------------------------
def test_save_state_keywords_the_backend_cannot_pass_are_refused(tmp_path):
    accelerator, *_ = _setup(automatic=False)
    with pytest.raises(ConfigError, match="exclude_frozen_parameters.*engine.save_checkpoint.*drop them"):
        accelerator.save_state(tmp_path / "ckpt", exclude_frozen_parameters=True)
    assert not (tmp_path / "ckpt").exists()


def test_load_state_strict_assign_and_unknown_keywords(tmp_path):
    accelerator, model, *_ = _setup(automatic=False)
    accelerator.save_state(tmp_path / "ckpt", safe_serialization=False)
    _reset()
    accelerator = Accelerator()
    bigger = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2), torch.nn.Linear(2, 2))
    bigger = accelerator.prepare(bigger)
    with pytest.raises(CheckpointError, match="Missing key"):
        accelerator.load_state(tmp_path / "ckpt")
    kept = bigger[2].weight
    accelerator.load_state(tmp_path / "ckpt", strict=False, assign=True)
    assert torch.equal(bigger[0].weight, model[0].weight)
    assert bigger[0].weight.data_ptr() != model[0].weight.data_ptr() and bigger[2].weight is kept
    with pytest.raises(ConfigError, match="load_state\\(\\) got weights_only_please.*drop them"):
        accelerator.load_state(tmp_path / "ckpt", weights_only_please=True)

