"""hasten on torch_xla's CPU device, one process: an Accelerate-style script runs unchanged (workers/one_process.py
says what it checks)."""

import pytest

pytest.importorskip("torch_xla", reason="no torch_xla here: scripts/test.sh runs tests/xla in the side environment "
                                        "scripts/xla_env.sh builds")

from xla_runs import CASE_TIMEOUT, HERE, run  # noqa: E402


def test_whole_loop_collectives_checkpoint_and_metrics_on_xla0():
    output = run([HERE / "workers" / "one_process.py"], replicas=1, timeout=max(300, CASE_TIMEOUT))
    assert "OK" in output
