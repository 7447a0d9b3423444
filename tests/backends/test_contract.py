"""Every registered backend keeps one contract (tests/workers/backend_contract.py): the same small training
run gives plain PyTorch's weights, clip_grad_norm_ returns torch's total norm, save_state/load_state resumes
identically, unwrap_model gives the user's module back.

A new backend joins by adding its registry line (hasten/backends/__init__.py) and a row to RUNS below: the
launch flags that select it, and the number of processes. A registered backend without a row fails the test.
"""

from __future__ import annotations

import importlib
import importlib.util

import pytest

from hasten.backends import REGISTRY
from launching import FIXTURES, launch

# DeepSpeed: the contract script passes no DataLoader, so the config names the micro-batch (and the clipping the
# script asks for: DeepSpeed clips inside its step); the stage comes from the flag.
DEEPSPEED = ["--use_deepspeed", "--deepspeed_config_file", str(FIXTURES / "deepspeed_contract.json")]
FSDP = ["--use_fsdp", "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP",
        "--fsdp_transformer_layer_cls_to_wrap", "Block", "--fsdp_state_dict_type", "SHARDED_STATE_DICT"]

# run id -> (backend it must select, number of processes, launch flags)
RUNS = {
    "single": ("single", 1, ["--cpu"]),
    "ddp": ("ddp", 2, ["--cpu"]),
    "fsdp2": ("fsdp", 2, [*FSDP, "--fsdp_version", "2"]),
    "fsdp1": ("fsdp", 2, [*FSDP, "--fsdp_version", "1"]),
    "deepspeed_zero2": ("deepspeed", 2, [*DEEPSPEED, "--zero_stage", "2"]),
    "deepspeed_zero3": ("deepspeed", 2, [*DEEPSPEED, "--zero_stage", "3"]),
    "tensor_parallel": ("tensor_parallel", 2, ["--cpu", "--parallelism_config_tp_size", "2"]),
    "pipeline": ("pipeline", 2, ["--cpu", "--parallelism_config_pp_size", "2"]),
}
NEEDS = {run: "deepspeed" for run in RUNS if run.startswith("deepspeed")}  # run -> module it needs
# Known failures, with the reason; strict, so a fix shows up as an unexpected pass.
KNOWN_BROKEN: dict = {
    "pipeline": "the contract's loop is loss = mse(model(x), y); accelerator.backward(loss) on a model with its own "
                "forward, but a pipelined model is an nn.Sequential whose call runs the schedule and returns the loss "
                "(Accelerate's Megatron-LM convention); its checks run in tests/test_parallelism_pp.py",
}
CHECKS = ("training", "clip_grad_norm_", "save_state load_state", "unwrap_model get_state_dict")
# Backends whose contract runs elsewhere, with where: torch_xla cannot live in this environment.
ELSEWHERE = {
    "xla": "tests/xla/ (torch_xla's CPU device, in the side environment scripts/xla_env.sh builds): the whole loop, "
           "clipping, save_state/load_state and save_model on one process and on two replicas",
}


def test_every_registered_backend_has_a_contract_run():
    covered = {backend for backend, _, _ in RUNS.values()} | set(ELSEWHERE)
    missing = sorted(set(REGISTRY) - covered)
    assert not missing, f"add a row to RUNS in {__file__} for the backend(s) {missing}"


def test_no_backend_inherits_another_backends_layout():
    """Layouts compose (`hasten.parallelize`, one module per step) and what sharded backends keep is a helper object
    (`backends/sharded.py`): every registered backend derives from `Backend` alone. The tensor-parallel and pipeline
    backends were FSDPBackend subclasses."""
    from hasten.backends import Backend

    for name, (module, cls) in REGISTRY.items():
        backend = getattr(importlib.import_module(module), cls)
        assert backend.__mro__[1:] == (Backend, object), f"{name}: {[k.__name__ for k in backend.__mro__]}"


def _marks(run) -> list:
    marks = []
    if run in KNOWN_BROKEN:
        marks.append(pytest.mark.xfail(reason=KNOWN_BROKEN[run], strict=True))
    if run in NEEDS and importlib.util.find_spec(NEEDS[run]) is None:
        marks.append(pytest.mark.skip(reason=f'needs {NEEDS[run]}: pip install "hasten[{NEEDS[run]}]"'))
    return marks


@pytest.mark.parametrize("run", [pytest.param(run, marks=_marks(run)) for run in sorted(RUNS)])
def test_backend_keeps_the_contract(run, tmp_path):
    backend, processes, flags = RUNS[run]
    result = launch("backend_contract.py", backend, tmp_path, num_processes=processes, flags=flags, timeout=300)
    for check in CHECKS:
        assert result.stdout.count(f"CONTRACT OK {check}") == processes, result.stdout + result.stderr
