import os

import pytest


# Variables of the test run itself, not settings: the GPU suite's figures file (scripts/gpu_check.sh) must reach
# tests/gpu/conftest.py's record_figure, or the figures table is always empty.
KEPT = frozenset({"HASTEN_GPU_FIGURES"})


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
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    if os.environ != saved_environment:
        os.environ.clear()
        os.environ.update(saved_environment)
