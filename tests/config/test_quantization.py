"""bitsandbytes quantization without bitsandbytes: the config's checks, the import paths, the install hint, and
where `prepare` lets a quantized model train. (Quantizing itself is in test_bnb.py, which needs bitsandbytes.)"""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

from hasten.core.enums import CustomDtype
from hasten.core.errors import ConfigError
from hasten.big_model.bnb_params import quantized_model_placement
from hasten.utils import BnbQuantizationConfig


def test_defaults_follow_accelerate():
    eight = BnbQuantizationConfig(load_in_8bit=True)
    assert (eight.llm_int8_threshold, eight.torch_dtype, eight.target_dtype) == (6.0, torch.float16, torch.int8)
    assert eight.skip_modules is None and eight.keep_in_fp32_modules is None
    four = BnbQuantizationConfig(load_in_4bit=True)
    assert (four.bnb_4bit_quant_type, four.bnb_4bit_use_double_quant) == ("fp4", False)
    # the unquantized layers default to the 4-bit compute dtype, fp16 unless told
    assert four.bnb_4bit_compute_dtype == torch.float16 and four.torch_dtype == torch.float16
    assert four.target_dtype == CustomDtype.INT4
    bf16 = BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_compute_dtype="bf16")
    assert bf16.torch_dtype == torch.bfloat16
    explicit = BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float32, torch_dtype="fp16",
                                     skip_modules=("head",), keep_in_fp32_modules=["norm"])
    assert (explicit.bnb_4bit_compute_dtype, explicit.torch_dtype) == (torch.float32, torch.float16)
    assert explicit.skip_modules == ["head"] and explicit.keep_in_fp32_modules == ["norm"]


@pytest.mark.parametrize("kwargs, words", [
    (dict(), "both False"),
    (dict(load_in_8bit=True, load_in_4bit=True), "both True"),
    (dict(load_in_8bit=1), "load_in_8bit must be True or False"),
    (dict(load_in_4bit=True, bnb_4bit_use_double_quant="yes"), "bnb_4bit_use_double_quant"),
    (dict(load_in_4bit=True, bnb_4bit_quant_type="int4"), "'fp4', 'nf4'"),
    (dict(load_in_4bit=True, bnb_4bit_compute_dtype="fp64"), "bnb_4bit_compute_dtype='fp64'"),
    (dict(load_in_4bit=True, bnb_4bit_compute_dtype=torch.int8), "floating-point"),
    (dict(load_in_8bit=True, torch_dtype="float16"), "torch_dtype='float16'"),
    (dict(load_in_8bit=True, llm_int8_threshold="6"), "llm_int8_threshold must be a number"),
    (dict(load_in_8bit=True, skip_modules="head"), "skip_modules must be a list"),
    (dict(load_in_8bit=True, keep_in_fp32_modules=[nn.Linear]), "keep_in_fp32_modules must be a list"),
])
def test_bad_values_are_refused_in_one_line(kwargs, words):
    with pytest.raises(ValueError) as caught:  # Accelerate raises ValueError: callers' except still works
        BnbQuantizationConfig(**kwargs)
    assert isinstance(caught.value, ConfigError)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_threshold_with_4bit_warns():
    with pytest.warns(UserWarning, match="8-bit quantization only"):
        BnbQuantizationConfig(load_in_4bit=True, llm_int8_threshold=4.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        BnbQuantizationConfig(load_in_4bit=True)


def test_import_paths_and_lazy_bitsandbytes():
    """Accelerate's paths resolve, and none of them (nor preparing a plain model) loads bitsandbytes (~10 s)."""
    code = (
        "import sys, torch\n"
        "from hasten.utils.bnb import BnbQuantizationConfig, load_and_quantize_model, has_4bit_bnb_layers\n"
        "from hasten.utils.dataclasses import BnbQuantizationConfig as B2\n"
        "from hasten.utils import BnbQuantizationConfig as B3, load_and_quantize_model as L2\n"
        "assert BnbQuantizationConfig is B2 is B3 and load_and_quantize_model is L2\n"
        "from hasten import Accelerator\n"
        "model = Accelerator().prepare(torch.nn.Linear(2, 2))\n"
        "assert has_4bit_bnb_layers(model) is False\n"
        "print('bitsandbytes' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_missing_bitsandbytes_gives_the_install_line(monkeypatch):
    from hasten.utils.bnb import load_and_quantize_model, replace_with_bnb_layers

    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # `import bitsandbytes` now fails as if absent
    config = BnbQuantizationConfig(load_in_8bit=True)
    with pytest.raises(ImportError, match=r'pip install "hasten\[bnb\]"'):
        load_and_quantize_model(nn.Sequential(nn.Linear(2, 2)), config)
    with pytest.raises(ImportError, match=r'pip install "hasten\[bnb\]"'):
        replace_with_bnb_layers(nn.Sequential(nn.Linear(2, 2)), config)


def _quantized(device_map, bits=4):
    model = nn.Linear(2, 2)
    setattr(model, f"is_loaded_in_{bits}bit", True)
    if device_map is not None:
        model.hf_device_map = device_map
    return model


def test_prepare_placement_of_quantized_models():
    cpu, cuda0, cuda1 = torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 1)
    # not quantized, or quantized without a map: the caller's choice stands
    assert quantized_model_placement(nn.Linear(2, 2), cpu, False, True) is True
    assert quantized_model_placement(_quantized(None), cpu, False, True) is True
    # dispatched where it trains: left in place
    assert quantized_model_placement(_quantized({"": "cpu"}), cpu, True, True) is False
    assert quantized_model_placement(_quantized({"": 0}), cuda0, True, True) is False
    assert quantized_model_placement(_quantized({"": 0}), torch.device("cuda"), False, True) is False
    assert quantized_model_placement(_quantized({"a": 0, "b": 1}), cuda0, False, True) is False
    refusals = [
        (_quantized({"a": "cpu", "b": "disk"}), cpu, False, "offloaded to disk, which cannot train"),
        (_quantized({"a": 0, "b": "cpu"}, bits=8), cuda0, False, "8-bit model with modules offloaded to cpu"),
        (_quantized({"a": 0, "b": 1}), cuda0, True, "distributed run"),
        (_quantized({"": 1}), cuda0, False, "loaded on cuda:1 but this process trains on cuda:0"),
        (_quantized({"": "cpu"}), cuda1, False, "device_map={'': 1}"),
    ]
    for model, device, distributed, words in refusals:
        with pytest.raises(ConfigError, match=words) as caught:
            quantized_model_placement(model, device, distributed, True)
        assert "\n" not in str(caught.value)
        if "offloaded" in words:
            assert str(caught.value).startswith("You can't train a model that has been loaded in 8-bit or 4-bit "
                                                "precision with CPU or disk offload")


def test_a_quantized_model_on_a_cpu_run_needs_a_bitsandbytes_that_computes_on_the_cpu():
    from unittest import mock

    from hasten import Accelerator

    cpu = torch.device("cpu")
    assert quantized_model_placement(_quantized({"": "cpu"}), cpu, False, True, bnb_runs_on_cpu=lambda: True) is False
    with pytest.raises(ConfigError, match="CPU or disk offload.*cannot train on the CPU here"):
        quantized_model_placement(_quantized({"": "cpu"}), cpu, False, True, bnb_runs_on_cpu=lambda: False)
    # prepare() asks the probe under the name Accelerate's code (and tests) patch
    with mock.patch("hasten.accelerator.is_bitsandbytes_multi_backend_available", return_value=False):
        with pytest.raises(ValueError, match="CPU or disk offload"):
            Accelerator(cpu=True).prepare_model(_quantized({"": "cpu"}, bits=8))
    with mock.patch("hasten.accelerator.is_bitsandbytes_multi_backend_available", return_value=True), \
            mock.patch("hasten.accelerator.is_xpu_available", return_value=True):
        with pytest.raises(ValueError, match="CPU or disk offload"):  # as Accelerate on a machine with XPUs
            Accelerator(cpu=True).prepare_model(_quantized({"": "cpu"}, bits=8))


def test_prepare_refuses_a_disk_offloaded_quantized_model():
    from hasten import Accelerator

    with pytest.raises(ValueError, match="cannot train"):
        Accelerator(cpu=True).prepare(_quantized({"0": "cpu", "1": "disk"}, bits=8))
