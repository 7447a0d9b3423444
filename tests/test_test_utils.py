"""hasten.test_utils: what tests written for Accelerate's `accelerate.test_utils` rely on."""

from __future__ import annotations

import sys
import unittest
from types import SimpleNamespace

import pytest
import torch

from hasten import test_utils
from hasten.test_utils import testing
from hasten.test_utils.examples import (
    clean_lines,
    compare_against_test,
    get_function_contents_by_name,
)


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


# -- Accelerate's MRPC loaders for its example tests -------------------------------------------------------------
def _tiny_tokenizer(tmp_path):
    transformers = pytest.importorskip("transformers")
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<eos>", "the", "cat", "sat", "a", "dog", "ran", "far",
             "on", "mat", "it", "is", "good", "bad"]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(words) + "\n")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(vocab), eos_token="<eos>")
    return transformers, tokenizer


def _mrpc_files(root):
    folder = root / "tests" / "test_samples" / "MRPC"
    folder.mkdir(parents=True)
    rows = [("the cat sat", "a cat sat on the mat", 1), ("a dog ran", "it is good", 0),
            ("the dog ran far", "the dog ran", 1), ("it is bad", "the mat", 0), ("a cat", "a dog", 0)]
    for name, part in (("train.csv", rows), ("dev.csv", rows[:3])):
        (folder / name).write_text("label,sentence1,sentence2\n" + "".join(f"{lab},{a},{b}\n" for a, b, lab in part))


def test_mocked_dataloaders_read_the_mrpc_samples_with_accelerates_batch_sizes(tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    transformers, tokenizer = _tiny_tokenizer(tmp_path)
    asked = []
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda name, *a, **k: asked.append(name) or tokenizer)
    _mrpc_files(tmp_path)
    monkeypatch.chdir(tmp_path)  # the files are found relative to the working directory, as in Accelerate
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    from hasten import Accelerator
    from hasten.test_utils.training import (
        mocked_dataloaders,
        mocked_dataloaders_for_autoregressive_models,
    )

    accelerator = Accelerator(cpu=True)
    train, evaluation = mocked_dataloaders(accelerator, batch_size=16)
    assert asked == ["bert-base-cased"]
    batches = list(train)
    assert [len(b["labels"]) for b in batches] == [2, 2, 1]  # batch size 2, whatever batch_size says
    # labels are numbered in the order the training file shows them: "1" (two rows) -> 0, "0" (three rows) -> 1
    assert sorted(torch.cat([b["labels"] for b in batches]).tolist()) == [0, 0, 1, 1, 1]
    assert {"input_ids", "attention_mask", "token_type_ids", "labels"} <= set(batches[0])
    assert len(list(evaluation)) == 3 and next(iter(evaluation))["input_ids"].shape[0] == 1

    train, evaluation = mocked_dataloaders_for_autoregressive_models(accelerator)
    assert asked[-1] == "HuggingFaceTB/SmolLM-360M"
    batch = next(iter(train))
    pad = tokenizer.pad_token_id
    assert pad == tokenizer.eos_token_id  # the end-of-text token pads
    full = tokenizer(["the cat sat", "a dog ran"])["input_ids"]
    longest = max(len(ids) for ids in full)
    assert batch["input_ids"].shape == batch["labels"].shape == (2, longest)
    assert batch["labels"][0, : len(full[0]) - 1].tolist() == full[0][1:]  # next-token targets
    assert (batch["labels"][1, len(full[1]) - 1:] == -100).all()  # padding is ignored by the loss
    bf16 = SimpleNamespace(distributed_type=accelerator.distributed_type, mixed_precision="bf16",
                           main_process_first=accelerator.main_process_first)
    train, _ = mocked_dataloaders_for_autoregressive_models(bf16)
    assert next(iter(train))["input_ids"].shape[1] % 8 == 7  # mixed precision pads to a multiple of 8, less one
