"""Auto-resume (issue 17, part 2): `load_state()` on a fresh project, `ProjectConfiguration(automatic_resume=True)`,
and runs killed with SIGKILL under `--max_restarts 1` that end bit-identical to an uninterrupted run."""

from __future__ import annotations

import functools
import os
import random
import shutil
import tempfile

import pytest
import torch

from hasten import Accelerator, ProjectConfiguration
from hasten.checkpoint.auto_resume import objects_in
from hasten.core.errors import CheckpointError, ConfigError
from launching import launch

SCRIPT = "resume_train.py"


# -- in one process ---------------------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def no_handlers_left():
    """Accelerators built here with automatic_resume install SIGTERM/SIGUSR1 handlers in pytest's process."""
    yield
    from hasten.resilience import preemption

    if preemption._active is not None:
        preemption._active.uninstall()


class Counter:
    def __init__(self):
        self.value = 0

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


def _objects(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    g = torch.Generator().manual_seed(99)  # the same data whatever the seed of the weights
    data = torch.utils.data.TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 2, generator=g))
    return model, optimizer, scheduler, torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)


def _accelerator(tmp_path, **project):
    from hasten.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True, **project)
    return Accelerator(project_config=config)


def _train_and_save(tmp_path, batches=3):
    """A first run: a few steps, a checkpoint; returns what it saved."""
    accelerator = _accelerator(tmp_path)
    model, optimizer, scheduler, loader = _objects()
    model, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler, loader)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    batches_of_this_epoch = iter(loader)
    for _ in range(batches):
        x, y = next(batches_of_this_epoch)
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            counter.value += 1
    accelerator.save_state()
    remaining = [x.clone() for x, _ in batches_of_this_epoch]
    return {k: v.clone() for k, v in model.state_dict().items()}, scheduler.get_last_lr(), remaining


def test_load_state_on_a_fresh_project_is_a_no_op_with_automatic_resume(tmp_path, caplog):
    accelerator = _accelerator(tmp_path)
    model, optimizer, *_ = _objects()
    model, optimizer = accelerator.prepare(model, optimizer)
    with pytest.raises(FileNotFoundError, match="automatic_resume=True"):  # Accelerate's error by default
        accelerator.load_state()
    accelerator.project_configuration.automatic_resume = True
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with caplog.at_level("INFO", logger="hasten.checkpoint.layout"):
        assert accelerator.load_state() is None
    assert "no checkpoint" in caplog.text
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert accelerator.save_iteration == 0
    # An explicit folder that does not exist still raises, as in Accelerate.
    with pytest.raises(ValueError, match="not a directory"):
        accelerator.load_state(tmp_path / "checkpoints" / "checkpoint_7")


def test_automatic_resume_waits_for_every_object_then_loads_once(tmp_path):
    weights, lr, remaining = _train_and_save(tmp_path)
    assert objects_in(str(tmp_path / "checkpoints" / "checkpoint_0")) == {
        "models": 1, "optimizers": 1, "schedulers": 1, "dataloaders": 1, "custom_objects": 1}

    accelerator = _accelerator(tmp_path, automatic_resume=True)
    model, optimizer, scheduler, loader = _objects(seed=5)  # different initial weights
    model = accelerator.prepare(model)
    assert not torch.equal(model.weight, weights["weight"])  # not yet: the optimizer, ... are still missing
    optimizer, scheduler = accelerator.prepare(optimizer, scheduler)
    loader = accelerator.prepare_data_loader(loader)
    assert not torch.equal(model.weight, weights["weight"])  # the registered object is still missing
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert counter.value == 3 and scheduler.get_last_lr() == lr
    assert accelerator.save_iteration == 1  # the next save continues the numbering
    resumed = [x for x, _ in loader]  # the data position too: the rest of the epoch, in the same order
    assert len(resumed) == len(remaining) == 1 and torch.equal(resumed[0], remaining[0])


def test_automatic_resume_refuses_to_train_without_the_objects_it_needs(tmp_path):
    _train_and_save(tmp_path)
    accelerator = _accelerator(tmp_path, automatic_resume=True)
    model, optimizer, scheduler, loader = _objects()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)  # no scheduler, nothing registered
    x, y = next(iter(loader))
    with pytest.raises(ConfigError, match=r"1 schedulers \(have 0\).*1 custom objects \(have 0\)"):
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
    accelerator.register_for_checkpointing(Counter())
    accelerator.load_state()  # an explicit load replaces the automatic one (here without the scheduler)
    accelerator.backward(torch.nn.functional.mse_loss(model(x), y))


def test_automatic_resume_on_a_fresh_or_damaged_project(tmp_path):
    accelerator = _accelerator(tmp_path, automatic_resume=True)
    model, optimizer, *_ = _objects()
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.backward(model(torch.ones(1, 4)).sum())  # nothing was waiting: training starts from scratch
    assert accelerator._preemption is not None  # automatic_resume turns preemption handling on
    os.makedirs(tmp_path / "checkpoints" / "checkpoint_0")  # a folder with no checkpoint in it
    with pytest.raises(CheckpointError, match="damaged"):
        _accelerator(tmp_path, automatic_resume=True)


def test_project_configuration_fields():
    # Accelerate's positional order is unchanged; the new fields come after it.
    config = ProjectConfiguration("runs", None, True, 2, 5, False)
    assert (config.project_dir, config.total_limit, config.iteration) == ("runs", 2, 5)
    assert config.automatic_resume is False and config.handle_preemption is False
    assert ProjectConfiguration(automatic_checkpoint_naming=True, automatic_resume=True).handle_preemption is True
    assert ProjectConfiguration(automatic_checkpoint_naming=True, automatic_resume=True,
                                handle_preemption=False).handle_preemption is False
    for field in ("automatic_resume", "handle_preemption"):
        with pytest.raises(ConfigError, match="automatic_checkpoint_naming=True"):
            ProjectConfiguration(project_dir="runs", **{field: True})


# -- real processes: killed with SIGKILL, restarted by the launcher --------------------------------------------------
@functools.lru_cache(maxsize=None)
def reference_run() -> dict:
    """The uninterrupted run (launched once per test session; the preemption tests compare with it too)."""
    workdir = tempfile.mkdtemp(prefix="hasten-resume-reference-")
    try:
        launch(SCRIPT, workdir, "flag", "none")
        return torch.load(os.path.join(workdir, "final.pt"))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def assert_same_finish(workdir, extra_saves=0) -> None:
    reference, final = reference_run(), torch.load(os.path.join(workdir, "final.pt"))
    assert reference["weights"].keys() == final["weights"].keys()
    for name, tensor in reference["weights"].items():
        assert torch.equal(tensor, final["weights"][name]), f"{name} differs from the uninterrupted run"
    assert final["micro"] == reference["micro"] == 24
    assert final["step"] == reference["step"]
    assert final["iteration"] == reference["iteration"] + extra_saves


# Ten kills at steps drawn by a seeded RNG: which rank, after which of the 24 micro-steps, and every third one in
# the middle of a save (at one of its first crash points). Three run by default; set HASTEN_TEST_ALL_KILLS=1 for
# all ten (about 15-40 s each).
_rng = random.Random(17)
KILLS = []
for _i in range(10):
    _rank = _rng.randrange(2)
    if _i % 3 == 2:
        KILLS.append(f"save:{_rank}:{_rng.choice(range(3, 24, 3))}:{_rng.randint(1, 6)}")
    else:
        KILLS.append(f"kill:{_rank}:{_rng.randint(1, 24)}")
ALL_KILLS = bool(os.environ.get("HASTEN_TEST_ALL_KILLS"))


@pytest.mark.parametrize("index", range(10))
def test_sigkill_then_restart_ends_bit_identical(index, tmp_path):
    if index >= 3 and not ALL_KILLS:
        pytest.skip("set HASTEN_TEST_ALL_KILLS=1 to run all ten kills")
    event = KILLS[index]
    resume = "flag" if index % 2 == 0 else "call"  # automatic_resume, or one load_state() call
    result = launch(SCRIPT, str(tmp_path), resume, event, flags=["--max_restarts", "1"])
    assert "attempt=1" in result.stdout, f"{event}: the run was not restarted\n{result.stdout}"
    assert_same_finish(tmp_path)
