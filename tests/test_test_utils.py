"""hasten.test_utils: what tests written for Accelerate's `accelerate.test_utils` rely on."""

from __future__ import annotations

import sys
import unittest

import pytest
import torch

from hasten import test_utils
from hasten.test_utils import testing
from hasten.test_utils.examples import clean_lines, compare_against_test, get_function_contents_by_name


def test_launch_command():
    assert test_utils.get_launch_command(num_processes=2, debug=True, cpu=False, config_file=None) == [
        "hasten", "launch", "--num_processes=2", "--debug"]
    assert test_utils.DEFAULT_LAUNCH_COMMAND[:2] == ["hasten", "launch"]


def _skipped(decorator) -> bool:
    @decorator
    def probe():
        pass

    return bool(getattr(probe, "__unittest_skip__", False))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_device_requirements_on_a_cpu_machine():
    assert test_utils.torch_device == "cpu" and test_utils.device_count == 1
    assert test_utils.memory_allocated_func() == 0
    assert not _skipped(test_utils.require_cpu)
    for decorator in (test_utils.require_cuda, test_utils.require_non_cpu, test_utils.require_multi_gpu,
                      test_utils.require_single_device, test_utils.require_fp16, test_utils.require_tpu,
                      test_utils.require_fp8):
        assert _skipped(decorator), decorator


def test_library_and_version_requirements():
    assert _skipped(testing.require_deepspeed) is not testing.a.is_deepspeed_available()
    assert not _skipped(test_utils.require_torch_min_version(version="2.0"))
    assert _skipped(test_utils.require_torch_min_version(version="99.0"))
    assert _skipped(test_utils.skip)


def test_slow_needs_run_slow(monkeypatch):
    monkeypatch.delenv("RUN_SLOW", raising=False)
    assert _skipped(test_utils.slow)
    monkeypatch.setenv("RUN_SLOW", "yes")
    assert not _skipped(test_utils.slow)


def test_regression_problem():
    data = test_utils.RegressionDataset(a=2, b=3, length=16, seed=0)
    assert len(data) == 16 and set(data[0]) == {"x", "y"}
    again = test_utils.RegressionDataset(a=2, b=3, length=16, seed=0)
    assert (data.x == again.x).all()
    assert abs(float(data.y[0] - (2 * data.x[0] + 3))) < 0.5  # y = a*x + b plus small noise
    model = test_utils.RegressionModel(a=1, b=2)
    x = torch.tensor([1.0, 2.0])
    assert torch.equal(model(x), torch.tensor([3.0, 4.0]))
    first, second = test_utils.RegressionModel(a=1, b=2, double_output=True)(x)
    assert torch.equal(first, second)


def test_assert_exception():
    with test_utils.assert_exception(ValueError, "bad"):
        raise ValueError("a bad value")
    with pytest.raises(AssertionError, match="ran without an exception"):
        with test_utils.assert_exception(ValueError):
            pass
    with pytest.raises(AssertionError, match="expected 'other'"):
        with test_utils.assert_exception(ValueError, "other"):
            raise ValueError("a bad value")


def test_capture_and_subprocess_helpers():
    assert test_utils.capture_call_output(print, "hello") == "hello\n"
    result = test_utils.execute_subprocess_async([sys.executable, "-c", "print('out')"], quiet=True, echo=False)
    assert result.returncode == 0 and result.stdout == ["out"]
    with pytest.raises(RuntimeError, match="boom"):
        test_utils.execute_subprocess_async([sys.executable, "-c", "import sys; sys.exit('boom')"], quiet=True,
                                            echo=False)
    assert testing.run_command([sys.executable, "-c", "print(2)"], return_stdout=True).strip() == "2"
    with pytest.raises(testing.SubprocessCallException, match="failed"):
        testing.run_command([sys.executable, "-c", "import sys; sys.exit(3)"])


def test_ports_and_paths(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    assert test_utils.pytest_xdist_worker_id() == 3 and test_utils.get_torch_dist_unique_port() == 29503
    assert (test_utils.path_in_accelerate_package("utils") / "__init__.py").is_file()


def test_the_same_tensors_on_one_process():
    assert test_utils.are_the_same_tensors(torch.arange(3))


def test_test_case_bases(tmp_path):
    from hasten import Accelerator
    from hasten.state import AcceleratorState

    class Case(testing.AccelerateTestCase):
        def test_it(self):
            Accelerator(cpu=True)

    result = unittest.TestResult()
    Case("test_it").run(result)
    assert result.wasSuccessful(), result.errors
    assert not AcceleratorState._shared_state  # reset after the test

    class Folder(testing.TempDirTestCase):
        def test_it(self):
            pass

    Folder.setUpClass()
    (Folder.tmpdir / "sub").mkdir()
    (Folder.tmpdir / "file").write_text("x")
    Folder("test_it").setUp()
    assert list(Folder.tmpdir.iterdir()) == []
    Folder.tearDownClass()
    assert not Folder.tmpdir.exists()


def test_examples_comparison(tmp_path, monkeypatch):
    base = ["def training_function(config):\n", "    model = make()\n", "    train(model)\n", "def main():\n"]
    feature = base[:2] + ["    # a comment\n", "    accelerator.log(x)\n"] + base[2:]
    assert get_function_contents_by_name(base, "training_function") == base[:3]
    assert clean_lines(["# c\n", "\n", "x\n"]) == ["x\n"]
    with pytest.raises(ValueError):
        get_function_contents_by_name(base, "other")
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "nlp_example.py").write_text("".join(base))
    (tmp_path / "feature.py").write_text("".join(feature))
    (tmp_path / "complete.py").write_text("".join(feature))
    (tmp_path / "incomplete.py").write_text("".join(base))
    monkeypatch.chdir(tmp_path)
    assert compare_against_test("complete.py", "feature.py", parser_only=False) == []
    assert compare_against_test("incomplete.py", "feature.py", parser_only=False) == ["    accelerator.log(x)\n"]


def test_mocking_test_case_starts_and_stops_mocks():
    import os
    from unittest import mock

    class Case(testing.MockingTestCase):
        def setUp(self):
            super().setUp()
            self.add_mocks(mock.patch.dict(os.environ, {"MOCKED_BY_CASE": "1"}))

        def test_it(self):
            assert os.environ["MOCKED_BY_CASE"] == "1"

    result = unittest.TestResult()
    Case("test_it").run(result)
    assert result.wasSuccessful() and "MOCKED_BY_CASE" not in os.environ


def _all_bundled_checks():
    from hasten.test_utils import test_ops, test_script, test_sync

    test_ops.main()
    test_sync.main()
    test_script.main()


def test_bundled_self_check_scripts_pass_on_two_processes_and_catch_a_wrong_gradient(monkeypatch, capfd):
    """Accelerate's `test_utils.test_ops/test_sync/test_script` entry points: hasten's own checks, at its paths."""
    from hasten import debug_launcher
    from hasten.test_utils import path_in_accelerate_package, test_sync

    for name in ("test_ops.py", "test_sync.py", "test_script.py"):
        assert path_in_accelerate_package("test_utils", "scripts", name).is_file()
    debug_launcher(_all_bundled_checks, num_processes=2)
    out = capfd.readouterr().out
    for line in ("test_ops: collectives agree on 2", "test_sync: gradient synchronisation is right on 2",
                 "test_script: all checks passed on 2"):
        assert line in out, out
    # The checks can fail: a backward that forgets to scale accumulated losses is caught (one process, no launch).
    from hasten import Accelerator

    monkeypatch.setattr(Accelerator, "backward", lambda self, loss, **kwargs: loss.backward())
    with pytest.raises(AssertionError, match="differ from one full-batch step"):
        test_sync.check_accumulate(Accelerator(cpu=True, gradient_accumulation_steps=2))
