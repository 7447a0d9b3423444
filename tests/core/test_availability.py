"""`is_*_available` probes, version checks and `utils.constants` (Accelerate's `utils.imports/versions/constants`)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

import hasten.utils as utils
from hasten.core import availability
from hasten.utils import constants, imports, versions


def test_every_probe_answers_a_bool_without_importing_its_library():
    # In a fresh interpreter: run every library probe, then list which probed libraries got imported.
    code = textwrap.dedent("""
        import json, sys
        import hasten.utils.imports as imports
        before = set(sys.modules)
        names = [n for n in dir(imports) if n.startswith("is_") and n.endswith("_available")]
        skip = {"is_bitsandbytes_multi_backend_available"}  # asks bitsandbytes itself, when installed
        answers = {n: getattr(imports, n)() for n in names if n not in skip}
        heavy = ["tensorboard", "wandb", "mlflow", "deepspeed", "transformers", "datasets", "peft", "timm",
                 "torchvision", "pandas", "matplotlib", "bitsandbytes", "torchao", "transformer_engine", "rich"]
        print(json.dumps({"answers": answers, "imported": [m for m in heavy if m in sys.modules and m not in before]}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["imported"] == []
    assert len(result["answers"]) > 50
    assert all(isinstance(v, bool) for v in result["answers"].values()), result["answers"]
    assert result["answers"]["is_pytest_available"] is True


def test_a_folder_named_like_a_library_is_not_the_library(tmp_path, monkeypatch):
    # A made-up library, so the answer does not depend on what this machine has installed.
    is_fake_available = availability._probe("hasten_fake_tracker")
    assert is_fake_available.__name__ == "is_hasten_fake_tracker_available"
    assert is_fake_available() is False
    (tmp_path / "hasten_fake_tracker").mkdir()
    (tmp_path / "hasten_fake_tracker" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert is_fake_available() is False
    # ... installed (it has package metadata): it counts
    dist = tmp_path / "hasten_fake_tracker-0.19.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hasten_fake_tracker\nVersion: 0.19.0\n")
    assert is_fake_available() is True


def test_version_checks():
    assert utils.compare_versions("torch", ">=", "2.0") is True
    assert utils.compare_versions("1.2.3", "<", "1.10") is True  # numeric, not string, order
    assert utils.is_torch_version("==", versions.torch_version)
    assert versions.torch_version == torch.__version__.split("+")[0]
    with pytest.raises(ValueError, match="operation must be one of"):
        utils.compare_versions("1.0", "=>", "1.0")


def test_cpu_precisions_and_fp8_probes_on_this_machine():
    # As in Accelerate: fp16 counts as available except on Gaudi 1; bf16 on CPU too.
    assert utils.is_fp16_available() is True
    assert utils.is_bf16_available() is True
    assert utils.is_fp8_available() == (utils.is_transformer_engine_available() or utils.is_msamp_available()
                                        or utils.is_torchao_available())
    assert utils.is_pippy_available() is utils.is_torch_version(">=", "2.4.0")
    assert utils.is_weights_only_available() is True


def test_rich_needs_the_library_and_the_switch(monkeypatch):
    monkeypatch.setenv("ACCELERATE_ENABLE_RICH", "1")
    assert utils.is_rich_available() == availability._installed("rich")
    monkeypatch.setenv("ACCELERATE_ENABLE_RICH", "0")
    assert utils.is_rich_available() is False
    monkeypatch.setenv("ACCELERATE_ENABLE_RICH", "maybe")  # a probe never raises
    assert utils.is_rich_available() is False


def test_megatron_needs_the_switch(monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_MEGATRON_LM", raising=False)
    assert utils.is_megatron_lm_available() is False


@pytest.mark.skipif(imports.is_deepspeed_available(), reason="DeepSpeed is installed")
def test_required_decorators_name_the_install():
    @utils.deepspeed_required
    def needs_deepspeed():
        return "ran"

    with pytest.raises(ImportError, match=r'pip install "hasten\[deepspeed\]"'):
        needs_deepspeed()
    assert needs_deepspeed.__name__ == "needs_deepspeed"


CONSTANTS = {
    "MODEL_NAME": "pytorch_model", "SAFE_MODEL_NAME": "model", "WEIGHTS_NAME": "pytorch_model.bin",
    "SAFE_WEIGHTS_NAME": "model.safetensors", "WEIGHTS_PATTERN_NAME": "pytorch_model{suffix}.bin",
    "SAFE_WEIGHTS_PATTERN_NAME": "model{suffix}.safetensors", "WEIGHTS_INDEX_NAME": "pytorch_model.bin.index.json",
    "SAFE_WEIGHTS_INDEX_NAME": "model.safetensors.index.json", "OPTIMIZER_NAME": "optimizer",
    "SCHEDULER_NAME": "scheduler", "SAMPLER_NAME": "sampler", "SCALER_NAME": "scaler.pt",
    "RNG_STATE_NAME": "random_states", "PROFILE_PATTERN_NAME": "profile_{suffix}.json",
    "FSDP_MODEL_NAME": "pytorch_model_fsdp", "FSDP2_PYTORCH_VERSION": "2.6.0",
    "FSDP_SHARDING_STRATEGY": ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"],
    "FSDP2_STATE_DICT_TYPE": ["SHARDED_STATE_DICT", "FULL_STATE_DICT"],
    "TORCH_DYNAMO_MODES": ["default", "reduce-overhead", "max-autotune"],
}


@pytest.mark.parametrize("name, value", sorted(CONSTANTS.items()))
def test_constants_equal_accelerates(name, value):
    assert getattr(constants, name) == value
    if hasattr(utils, name) or name in utils._EXPORTS:
        assert getattr(utils, name) == value


def test_constant_lists():
    assert "MULTI_CPU" in constants.TORCH_DISTRIBUTED_OPERATION_TYPES
    assert set(constants.CUDA_DISTRIBUTED_TYPES) <= set(constants.TORCH_DISTRIBUTED_OPERATION_TYPES)
    assert {"nproc_per_node", "master_port", "rdzv_backend"} <= set(constants.TORCH_LAUNCH_PARAMS)
    assert torch.nn.Linear in constants.SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING
    assert constants.STR_OPERATION_TO_FUNC[">="](2, 1)


@pytest.mark.parametrize("safe", [True, False])
def test_checkpoint_files_carry_the_constant_names(tmp_path, safe):
    from hasten import Accelerator

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    accelerator.save_state(tmp_path / "ckpt", safe_serialization=safe)
    files = set(p.name for p in (tmp_path / "ckpt").iterdir())
    assert (constants.SAFE_WEIGHTS_NAME if safe else constants.WEIGHTS_NAME) in files
    assert {f"{constants.OPTIMIZER_NAME}.bin", f"{constants.SCHEDULER_NAME}.bin",
            f"{constants.RNG_STATE_NAME}_0.pkl"} <= files
