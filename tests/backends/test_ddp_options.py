"""What `DistributedDataParallelKwargs` and `InitProcessGroupKwargs` configure reaches torch's DDP module and
process group, on 2 real processes (tests/workers/ddp_options.py); what torch would ignore is refused."""

import pytest

from hasten import DistributedDataParallelKwargs
from hasten.core.errors import ConfigError

from launching import launch


def test_ddp_and_process_group_options_take_effect(tmp_path):
    """Each DistributedDataParallelKwargs field (dim, broadcast_buffers, bucket_cap_mb, find_unused_parameters,
    gradient_as_bucket_view, static_graph, comm_hook, comm_wrapper, comm_state_option) is read back from the
    DDP module or seen in training; InitProcessGroupKwargs(backend, init_method, timeout) from the group;
    clip_grad_norm_(norm_type=) and gather_for_metrics(input_data) on the same run."""
    result = launch("ddp_options.py", tmp_path)
    for check in ("InitProcessGroupKwargs", "bucket_cap_mb", "dim", "broadcast_buffers", "find_unused_parameters",
                  "gradient_as_bucket_view", "static_graph", "comm_hook comm_wrapper comm_state_option",
                  "clip_grad_norm_ norm_type", "gather_for_metrics input_data"):
        assert result.stdout.count(f"OK {check}") == 2, (check, result.stdout)  # lines of two ranks may interleave
    assert result.stdout.count("ALL DONE") == 2


def test_check_reduction_reaches_ddp_as_in_accelerate_and_strict_refuses_it(monkeypatch):
    """torch's DDP takes check_reduction, warns that it is deprecated and ignores it: as with Accelerate the handler
    passes it on (torch's warning says so); under hasten's strict setting it is refused in one line."""
    assert DistributedDataParallelKwargs(check_reduction=True).to_kwargs()["check_reduction"] is True
    monkeypatch.setenv("HASTEN_STRICT", "1")
    with pytest.raises(ConfigError, match=r"check_reduction=True\) has no effect") as caught:
        DistributedDataParallelKwargs(check_reduction=True)
    assert "\n" not in str(caught.value) and "fix:" in str(caught.value)


@pytest.mark.parametrize("kwargs, words", [
    ({"comm_wrapper": "fp16"}, "comm_hook is 'no'; fix: set comm_hook"),
    ({"comm_hook": "fp16", "comm_state_option": {"matrix_approximation_rank": 2}}, "configures PowerSGD"),
])
def test_ddp_options_torch_would_ignore_are_refused_in_one_line(kwargs, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")) as caught:
        DistributedDataParallelKwargs(**kwargs)
    assert "\n" not in str(caught.value) and "fix:" in str(caught.value)
    assert DistributedDataParallelKwargs(check_reduction=False, comm_hook="power_sgd", comm_wrapper="bf16",
                                         comm_state_option={"matrix_approximation_rank": 2})
