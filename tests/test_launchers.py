"""notebook_launcher and debug_launcher: run a Python function on several forked processes."""

from __future__ import annotations

import os

import pytest
import torch

from hasten import AcceleratorState, PartialState, debug_launcher, notebook_launcher
from hasten.core.errors import ConfigError, LaunchError


def _collective_report(scale):
    """Runs in each launched process."""
    from hasten.utils import gather, gather_object

    state = PartialState()
    ranks = gather(torch.tensor([state.process_index])).tolist()
    return {
        "rank": state.process_index,
        "world": state.num_processes,
        "type": str(state.distributed_type.value),
        "ranks": ranks,
        "objects": gather_object([state.process_index * scale]),
        "precision": os.environ.get("HASTEN_MIXED_PRECISION"),
        "cpu": os.environ.get("HASTEN_USE_CPU"),
    }


def _fail_on_rank_one():
    state = PartialState()
    if state.process_index == 1:
        raise ValueError("launched function fails on rank 1")
    state.wait_for_everyone()


def test_debug_launcher_runs_two_cpu_processes():
    PartialState()  # a state in the parent must not leak into the forked processes
    results = debug_launcher(_collective_report, args=(10,), num_processes=2)
    assert sorted(results) == [0, 1]
    for rank, report in results.items():
        assert report["rank"] == rank and report["world"] == 2 and report["type"] == "MULTI_CPU"
        assert report["ranks"] == [0, 1] and report["objects"] == [0, 10]
        assert report["cpu"] == "true" and report["precision"] == "no"
    assert PartialState().num_processes == 1  # the parent's own state is untouched
    assert "HASTEN_USE_CPU" not in os.environ  # and its environment restored


def _no_sync_keeps_gradients_apart():
    """Accelerate's test_sync picks its checks by distributed type: one process must be NO (test_noop_sync),
    not MULTI_CPU, where a one-rank DDP cannot make gradients differ under no_sync."""
    from hasten import Accelerator

    accelerator = Accelerator()
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    return str(accelerator.distributed_type.value), accelerator.num_processes, type(model).__name__


def test_debug_launcher_one_process_is_not_distributed():
    """As Accelerate's debug_launcher(num_processes=1): a single process, DistributedType.NO, model not wrapped."""
    results = debug_launcher(_no_sync_keeps_gradients_apart, num_processes=1)
    assert results == {0: ("NO", 1, "Linear")}


def test_notebook_launcher_two_processes_and_precision_reaches_them():
    results = notebook_launcher(_collective_report, args=(1,), num_processes=2, mixed_precision="bf16", use_port="0")
    assert [results[r]["objects"] for r in (0, 1)] == [[0, 1], [0, 1]]
    # Unlike Accelerate 1.15 (which exported an unread MIXED_PRECISION), the choice reaches the processes.
    assert results[0]["precision"] == "bf16"


def test_notebook_launcher_one_process_runs_in_place():
    seen = {}

    def function(value):
        seen["value"] = value
        seen["precision"] = os.environ.get("HASTEN_MIXED_PRECISION")
        return "done"

    assert notebook_launcher(function, args=(5,), num_processes=1, mixed_precision="fp16") == "done"
    assert seen == {"value": 5, "precision": "fp16"}
    assert "HASTEN_MIXED_PRECISION" not in os.environ


def test_failing_rank_raises_a_launch_error_naming_it():
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    with pytest.raises(LaunchError, match=r"rank 1 \(local rank 1\) failed: ValueError: launched function fails") as caught:
        debug_launcher(_fail_on_rank_one, num_processes=2)
    # ... and torch's ChildFailedError, which Accelerate's launchers raise and its test_notebook.py catches
    assert isinstance(caught.value, ChildFailedError) and caught.value.failures  # torch's record, kept
    assert str(caught.value).startswith("launched function failed: rank 1") and "\n" not in str(caught.value)


def _state_on_rank_zero_only():
    # The shape of Accelerate's notebook test (`tough_nut_function`): one process builds a state, its peer ends
    # its function without one.
    if os.environ["RANK"] == "0":
        PartialState()


def test_a_peer_that_ends_without_joining_fails_the_joiner_at_once_naming_it(monkeypatch):
    """Issue 40: rank 0 waited in the group's rendezvous for rank 1, which had returned, until killed (the collective
    timeout, 30 minutes on gloo). Now it fails with a line naming rank 1. The timeout is cut to 120 s here so that
    a regression fails instead of hanging the suite; the message shows the departure was seen, not the timeout."""
    monkeypatch.setenv("HASTEN_COLLECTIVE_TIMEOUT", "120")
    with pytest.raises(LaunchError, match=r"rank 0 \(local rank 0\) failed: ProcessLeftError: rank 0: rank 1 of 2 "
                                          r"ended the launched function without joining the process group"):
        notebook_launcher(_state_on_rank_zero_only, num_processes=2, use_port="0")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"num_processes": None}, "needs num_processes"), ({"num_processes": 2, "mixed_precision": "fp12"}, "fp12"),
     ({"num_processes": 2, "node_rank": 1, "num_nodes": 1}, "node_rank 1 must be below num_nodes 1")],
)
def test_notebook_launcher_bad_arguments(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        notebook_launcher(print, **kwargs)


def test_notebook_launcher_refuses_after_an_accelerator_exists():
    AcceleratorState(_from_accelerator=True)
    with pytest.raises(LaunchError, match="before any `Accelerator\\(\\)` is created"):
        notebook_launcher(print, num_processes=2)
