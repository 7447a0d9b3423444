"""Two XLA replicas (threads of one process under `xmp.spawn`, as `accelerate launch --tpu` starts them), with the
test-only channel-id/sync shim (shim/sitecustomize.py). Each case runs in its own process with a timeout."""

import pytest

pytest.importorskip("torch_xla", reason="no torch_xla here: scripts/test.sh runs tests/xla in the side environment "
                                        "scripts/xla_env.sh builds")

from xla_runs import HERE, run  # noqa: E402


@pytest.mark.parametrize("case", ["train", "collectives", "checkpoint", "late"])
def test_two_replicas(case, tmp_path):
    output = run([HERE / "workers" / "replicas.py", case], replicas=2, HASTEN_XLA_TEST_DIR=str(tmp_path))
    assert "OK 0" in output and "OK 1" in output, output[-3000:]
