"""hasten on torch_xla's CPU device, one process: an Accelerate-style script runs unchanged (workers/one_process.py
says what it checks)."""

import pytest

pytest.importorskip("torch_xla", reason="no torch_xla here: scripts/test.sh runs tests/xla in the side environment "
                                        "scripts/xla_env.sh builds")

from xla_runs import CASE_TIMEOUT, HERE, run  # noqa: E402


def test_whole_loop_collectives_checkpoint_and_metrics_on_xla0():
    output = run([HERE / "workers" / "one_process.py"], replicas=1, timeout=max(300, CASE_TIMEOUT))
    assert "OK" in output


def test_use_torch_xla_0_keeps_an_installed_torch_xla_out_of_the_run():
    probe = ("from hasten import Accelerator; a = Accelerator(); "
             "print('RUN', a.device, a.distributed_type.value, a._backend.name)")
    slow = max(300, CASE_TIMEOUT)  # one process: no hang to guard against, only a slow start on a busy machine
    assert "RUN cpu NO single" in run(["-c", probe], timeout=slow, USE_TORCH_XLA="0")
    assert "RUN xla:0 XLA xla" in run(["-c", probe], timeout=slow)
