import logging
import os

import pytest


# Variables of the test run itself, not settings: the GPU suite's figures file (scripts/gpu_check.sh) must reach
# tests/gpu/conftest.py's record_figure, or the figures table is always empty.
KEPT = frozenset({"HASTEN_GPU_FIGURES"})


def _logging_state():
    manager = logging.root.manager
    loggers = {name: lg for name, lg in manager.loggerDict.items() if isinstance(lg, logging.Logger)}
    return logging.root.level, list(logging.root.handlers), {
        name: (lg, lg.disabled, lg.propagate, lg.level) for name, lg in loggers.items()}


def _restore_logging(state):
    root_level, root_handlers, loggers = state
    logging.root.setLevel(root_level)
    logging.root.handlers[:] = root_handlers
    for lg, disabled, propagate, level in loggers.values():
        lg.disabled, lg.propagate = disabled, propagate
        lg.setLevel(level)


def _group_is_up() -> bool:
    """Whether a default process group exists, read from torch's own record (a test may patch `is_initialized`)."""
    import torch.distributed as dist

    return dist.is_available() and dist.distributed_c10d.GroupMember.WORLD is not None


@pytest.fixture
def one_process_group():
    """A one-process gloo group (the default group) for the test; fresh_state destroys it afterwards."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return dist.group.WORLD


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    """Every test starts with no hasten state and no hasten/Accelerate variables from the outside, and leaves
    the environment as it found it (a variable a test's code sets, such as PrepareForLaunch's FORK_LAUNCHED,
    would otherwise reach every later launch)."""
    saved_environment = dict(os.environ)
    for key in list(os.environ):
        if key.startswith(("HASTEN_", "ACCELERATE_")) and key not in KEPT:
            monkeypatch.delenv(key)
    from hasten.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    # Tests run two files side by side, each worker in its own order (scripts/test.sh): what one test leaves in the
    # process (a one-process group, which a later fork inherits; a logger another library's setup disabled or
    # raised) must not reach the next.
    group_was_up = _group_is_up()
    logging_state = _logging_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    if not group_was_up and _group_is_up():
        import torch.distributed as dist

        dist.destroy_process_group()
    _restore_logging(logging_state)
    if os.environ != saved_environment:
        os.environ.clear()
        os.environ.update(saved_environment)
