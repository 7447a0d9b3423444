"""Helpers for tests of code that uses hasten (Accelerate's `accelerate.test_utils.testing`).

`require_*` decorators skip a test (unittest's skip, so pytest honours them too) when what it needs is absent;
`get_launch_command` builds a `hasten launch` command line; the TestCase bases keep state from leaking
between tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import torch

from ..core import availability as a
from ..core.availability import *  # noqa: F401,F403 - Accelerate's testing module offers the probes too
from ..core.env import parse_flag_from_env  # noqa: F401 - published here too
from ..state import AcceleratorState, GradientState, PartialState


def get_backend() -> tuple:
    """(device type, device count, memory-allocated function) of this machine's accelerator, or the CPU's."""
    for probe, name in ((a.is_cuda_available, "cuda"), (a.is_xpu_available, "xpu"), (a.is_npu_available, "npu"),
                        (a.is_mlu_available, "mlu"), (a.is_musa_available, "musa"), (a.is_sdaa_available, "sdaa"),
                        (a.is_hpu_available, "hpu")):
        if probe():
            module = getattr(torch, name)
            return name, module.device_count(), module.memory_allocated
    if a.is_mps_available():
        return "mps", 1, getattr(torch.mps, "current_allocated_memory", lambda: 0)
    return "cpu", 1, lambda: 0


torch_device, device_count, memory_allocated_func = get_backend()


def get_launch_command(**kwargs) -> list:
    """`["hasten", "launch", "--key=value", ...]`; a True bool becomes a bare `--key`, None and False are left out."""
    command = ["hasten", "launch"]
    for key, value in kwargs.items():
        if value is True:
            command.append(f"--{key}")
        elif value is not None and value is not False:
            command.append(f"--{key}={value}")
    return command


DEFAULT_LAUNCH_COMMAND = get_launch_command(num_processes=device_count, monitor_interval=0.1)


def skip(test_case):
    return unittest.skip("skipped on purpose")(test_case)


def slow(test_case):
    """Run only when RUN_SLOW is set to a true value."""
    return unittest.skipUnless(parse_flag_from_env("RUN_SLOW", False), "slow test: set RUN_SLOW=1")(test_case)


def _requirement(condition, reason: str):
    def decorator(test_case):
        return unittest.skipUnless(condition(), reason)(test_case)

    return decorator


_non_cpu = lambda: torch_device != "cpu"  # noqa: E731
require_cpu = _requirement(lambda: torch_device == "cpu", "test requires only a CPU")
require_non_cpu = _requirement(_non_cpu, "test requires an accelerator (GPU, XPU, ...)")
require_cuda = _requirement(a.is_cuda_available, "test requires a CUDA GPU")
require_cuda_or_hpu = _requirement(lambda: a.is_cuda_available() or a.is_hpu_available(), "test requires a GPU or HPU")
require_cuda_or_xpu = _requirement(lambda: a.is_cuda_available() or a.is_xpu_available(), "test requires a GPU or XPU")
require_xpu = _requirement(a.is_xpu_available, "test requires an XPU")
require_non_xpu = _requirement(lambda: torch_device != "xpu", "test does not run on XPU")
require_non_hpu = _requirement(lambda: torch_device != "hpu", "test does not run on HPU")
require_mlu = _requirement(a.is_mlu_available, "test requires an MLU")
require_sdaa = _requirement(a.is_sdaa_available, "test requires an SDAA")
require_musa = _requirement(a.is_musa_available, "test requires a MUSA device")
require_npu = _requirement(a.is_npu_available, "test requires an NPU")
require_neuron = _requirement(a.is_neuron_available, "test requires a Neuron device")
require_mps = _requirement(a.is_mps_available, "test requires an Apple MPS device")
require_tpu = _requirement(lambda: a.is_torch_xla_available(check_is_tpu=True), "test requires a TPU")
require_non_torch_xla = _requirement(lambda: not a.is_torch_xla_available(), "test does not run with torch_xla")
require_fp16 = _requirement(lambda: a.is_fp16_available() and torch_device != "cpu", "test requires fp16 on an accelerator")
require_fp8 = _requirement(lambda: a.is_fp8_available() and a.is_cuda_available()
                           and torch.cuda.get_device_capability() >= (8, 9), "test requires fp8 (engine and GPU)")
require_fsdp2 = _requirement(lambda: a.is_torch_version(">=", "2.6.0"), "test requires torch >= 2.6 (FSDP2)")
require_single_device = _requirement(lambda: _non_cpu() and device_count == 1, "test requires exactly one accelerator")
require_single_gpu = _requirement(lambda: a.is_cuda_available() and device_count == 1, "test requires one GPU")
require_single_xpu = _requirement(lambda: a.is_xpu_available() and device_count == 1, "test requires one XPU")
require_multi_device = _requirement(lambda: _non_cpu() and device_count > 1, "test requires several accelerators")
require_multi_gpu = _requirement(lambda: a.is_cuda_available() and device_count > 1, "test requires several GPUs")
require_multi_xpu = _requirement(lambda: a.is_xpu_available() and device_count > 1, "test requires several XPUs")
require_multi_gpu_or_xpu = _requirement(lambda: (a.is_cuda_available() or a.is_xpu_available()) and device_count > 1,
                                        "test requires several GPUs or XPUs")
require_huggingface_suite = _requirement(lambda: a.is_transformers_available() and a.is_datasets_available(),
                                         "test requires transformers and datasets")
require_tp = _requirement(lambda: a.is_torch_version(">=", "2.3.0") and a.is_transformers_available(),
                          "test requires torch >= 2.3 and transformers")
require_pippy = _requirement(a.is_pippy_available, "test requires torch >= 2.4 (torch.distributed.pipelining)")
require_torchdata_stateful_dataloader = _requirement(a.is_torchdata_stateful_dataloader_available,
                                                     "test requires torchdata >= 0.8")
require_trackers = _requirement(lambda: any(p() for p in (
    a.is_wandb_available, a.is_tensorboard_available, a.is_comet_ml_available, a.is_aim_available,
    a.is_clearml_available, a.is_dvclive_available, a.is_mlflow_available, a.is_swanlab_available,
    a.is_trackio_available)), "test requires at least one tracker library")

# one decorator per optional library: require_<name> skips unless it is installed
for _name, _probe in {
    "peft": a.is_peft_available, "datasets": a.is_datasets_available, "transformers": a.is_transformers_available,
    "timm": a.is_timm_available, "torchvision": a.is_torchvision_available, "triton": a.is_triton_available,
    "schedulefree": a.is_schedulefree_available, "bnb": a.is_bnb_available, "deepspeed": a.is_deepspeed_available,
    "tensorboard": a.is_tensorboard_available, "wandb": a.is_wandb_available, "trackio": a.is_trackio_available,
    "comet_ml": a.is_comet_ml_available, "aim": a.is_aim_available, "clearml": a.is_clearml_available,
    "dvclive": a.is_dvclive_available, "swanlab": a.is_swanlab_available, "pandas": a.is_pandas_available,
    "mlflow": a.is_mlflow_available, "import_timer": a.is_import_timer_available,
    "transformer_engine": a.is_transformer_engine_available,
    "transformer_engine_mxfp8": a.is_transformer_engine_mxfp8_available, "torchao": a.is_torchao_available,
    "matplotlib": a.is_matplotlib_available,
}.items():
    globals()[f"require_{_name}"] = _requirement(_probe, f"test requires {_name}")
del _name, _probe


def require_torch_min_version(test_case=None, version: str | None = None):
    """Skip unless torch >= `version`; usable bare on a test or as `@require_torch_min_version(version="2.6")`."""
    if test_case is None:
        return lambda case: require_torch_min_version(case, version=version)
    return unittest.skipUnless(a.is_torch_version(">=", version), f"test requires torch >= {version}")(test_case)


def run_first(test_case):
    """Mark a test to run first when pytest-order is installed (devices that one process at a time may use)."""
    if a.is_pytest_available():
        import pytest

        return pytest.mark.order(1)(test_case)
    return test_case


class TempDirTestCase(unittest.TestCase):
    """One temporary folder (`self.tmpdir`) per TestCase class, emptied before each test (unless
    `clear_on_setup = False`) and removed after the class."""

    clear_on_setup = True

    @classmethod
    def setUpClass(cls):
        cls.tmpdir = Path(tempfile.mkdtemp())

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmpdir, ignore_errors=True)

    def setUp(self):
        if self.clear_on_setup:
            for path in self.tmpdir.iterdir():
                shutil.rmtree(path) if path.is_dir() else path.unlink()


class AccelerateTestCase(unittest.TestCase):
    """Resets the shared state (`AcceleratorState`, `GradientState`) after every test."""

    def tearDown(self):
        super().tearDown()
        AcceleratorState._reset_state(True)
        GradientState._reset_state()


class MockingTestCase(unittest.TestCase):
    """Call `self.add_mocks(mock_or_list)` at the end of `setUp`: each is started now and stopped after the test."""

    def add_mocks(self, mocks):
        self.mocks = list(mocks) if isinstance(mocks, (list, tuple)) else [mocks]
        for patcher in self.mocks:
            patcher.start()
            self.addCleanup(patcher.stop)


def are_the_same_tensors(tensor) -> bool:
    """True when every process holds the same `tensor` (gathered and compared)."""
    from ..distributed.operations import gather

    local = tensor[None].clone().to(PartialState().device)
    everyone = gather(local).cpu()
    return all(torch.equal(row, local[0].cpu()) for row in everyone)


class _RunOutput:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


async def _read_stream(stream, sink, echo_to):
    while True:
        line = await stream.readline()
        if not line:
            return
        text = line.decode("utf-8", errors="replace").rstrip()
        sink.append(text)
        if echo_to is not None:
            print(text, file=echo_to)


async def _run(cmd, env, stdin, timeout, quiet, echo):
    if echo:
        print("\nRunning:", " ".join(cmd))
    process = await asyncio.create_subprocess_exec(cmd[0], *cmd[1:], stdin=stdin, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.PIPE, env=env)
    out, err = [], []
    readers = [_read_stream(process.stdout, out, None if quiet else sys.stdout),
               _read_stream(process.stderr, err, None if quiet else sys.stderr)]
    try:
        await asyncio.wait_for(asyncio.gather(*readers, process.wait()), timeout=timeout)
    except asyncio.TimeoutError:
        process.kill()
        await process.wait()
        raise RuntimeError(f"'{' '.join(cmd)}' did not finish within {timeout}s and was killed") from None
    return _RunOutput(process.returncode, out, err)


def execute_subprocess_async(cmd: list, env=None, stdin=None, timeout=180, quiet=False, echo=True) -> _RunOutput:
    """Run `cmd`, streaming its output (unless `quiet`); raises RuntimeError with its stderr when it fails."""
    cmd = [str(part) for part in cmd]
    result = asyncio.run(_run(cmd, env, stdin, timeout, quiet, echo))
    if result.returncode != 0:
        stderr = "\n".join(result.stderr)
        raise RuntimeError(f"'{' '.join(cmd)}' failed with returncode {result.returncode}\n\n"
                           f"The combined stderr from workers follows:\n{stderr}")
    return result


class SubprocessCallException(Exception):
    pass


def run_command(command: list, return_stdout: bool = False, env=None):
    """`subprocess.check_output(command)`; SubprocessCallException with the output when it fails."""
    command = [str(part) for part in command]
    try:
        output = subprocess.check_output(command, stderr=subprocess.STDOUT, env=env if env is not None else os.environ.copy())
    except subprocess.CalledProcessError as error:
        raise SubprocessCallException(f"Command `{' '.join(command)}` failed:\n\n{error.output.decode()}") from error
    return output.decode("utf-8") if return_stdout else None


def pytest_xdist_worker_id() -> int:
    """This pytest-xdist worker's number (0 without xdist)."""
    return int(re.sub(r"^gw", "", os.environ.get("PYTEST_XDIST_WORKER", "gw0")))


def get_torch_dist_unique_port() -> int:
    """29500 plus the xdist worker number, so concurrent test workers do not collide."""
    return 29500 + pytest_xdist_worker_id()


def path_in_accelerate_package(*components: str) -> Path:
    """A path inside the installed hasten package."""
    return Path(__file__).resolve().parent.parent.joinpath(*components)


@contextlib.contextmanager
def assert_exception(exception_class, msg: str | None = None):
    """The block must raise `exception_class` (with `msg` in its text, if given); otherwise AssertionError."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 - any exception is checked against the expected class
        assert isinstance(error, exception_class), f"expected {exception_class.__name__}, got {type(error).__name__}: {error}"
        if msg is not None:
            assert msg in str(error), f"expected {msg!r} in the exception's message, got {str(error)!r}"
        return
    raise AssertionError(f"expected {exception_class.__name__}, but the block ran without an exception")


def capture_call_output(func, *args, **kwargs) -> str:
    """What `func(*args, **kwargs)` printed to stdout."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        func(*args, **kwargs)
    return buffer.getvalue()


__all__ = [name for name in dir() if not name.startswith("_") and name not in {
    "asyncio", "contextlib", "io", "os", "re", "shutil", "subprocess", "sys", "tempfile", "unittest",
    "torch", "a", "Path", "annotations"}]
