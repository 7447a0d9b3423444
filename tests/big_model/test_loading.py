"""Tensor-level helpers of hasten.utils.modeling: placing one tensor, listing tensors, ties, reading files."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from big_model_zoo import TinyLM
from hasten.core.errors import CheckpointError
from hasten.utils import (
    find_tied_parameters,
    id_tensor_storage,
    load_state_dict,
    named_module_tensors,
    retie_parameters,
    set_module_tensor_to_device,
)


def test_set_module_tensor_to_device_keeps_parameter_class_and_grad():
    layer = nn.Linear(3, 2)
    layer.weight.requires_grad_(False)
    set_module_tensor_to_device(layer, "weight", "meta")
    assert layer.weight.is_meta and isinstance(layer.weight, nn.Parameter) and not layer.weight.requires_grad
    with pytest.raises(ValueError, match="weight is on the meta device: pass `value`"):
        set_module_tensor_to_device(layer, "weight", "cpu")
    set_module_tensor_to_device(layer, "weight", "cpu", value=torch.ones(2, 3, dtype=torch.float64))
    assert layer.weight.dtype == torch.float32 and torch.equal(layer.weight, torch.ones(2, 3))  # cast to old dtype
    set_module_tensor_to_device(layer, "bias", "cpu", value=torch.zeros(2), dtype=torch.float16)
    assert layer.bias.dtype == torch.float16
    with pytest.raises(ValueError, match=r"shape \(5,\), the model expects \(2,\)") as refused:
        set_module_tensor_to_device(layer, "bias", "cpu", value=torch.zeros(5))
    # the text is exactly Accelerate's (code compares it whole); hasten's own words are a note
    assert str(refused.value) == ('Trying to set a tensor of shape torch.Size([5]) in "bias" (which has shape '
                                  'torch.Size([2])), this looks incorrect.')
    with pytest.raises(ValueError, match="no parameter or buffer named 'scale'"):
        set_module_tensor_to_device(layer, "scale", "cpu")
    model = nn.Sequential(nn.BatchNorm1d(2))
    set_module_tensor_to_device(model, "0.num_batches_tracked", "cpu", value=torch.tensor(7), dtype=torch.float16)
    assert model[0].num_batches_tracked.dtype == torch.int64 and model[0].num_batches_tracked.item() == 7


def test_named_module_tensors_and_non_persistent_buffers():
    norm = nn.BatchNorm1d(2)
    norm.register_buffer("scratch", torch.zeros(1), persistent=False)
    names = [name for name, _ in named_module_tensors(norm)]
    assert names == ["weight", "bias", "running_mean", "running_var", "num_batches_tracked", "scratch"]
    assert "scratch" not in [n for n, _ in named_module_tensors(norm, remove_non_persistent=True)]
    assert [n for n, _ in named_module_tensors(nn.Sequential(norm), recurse=True, include_buffers=False)] == [
        "0.weight", "0.bias"]


def test_retie_and_storage_ids():
    model = TinyLM()
    tied = find_tied_parameters(model)
    set_module_tensor_to_device(model, "embed.weight", "cpu", value=torch.zeros(64, 16))
    assert model.head.weight is not model.embed.weight
    retie_parameters(model, tied)
    assert model.head.weight is model.embed.weight
    base = torch.zeros(10)
    assert id_tensor_storage(base[:5]) == id_tensor_storage(base[5:]) != id_tensor_storage(torch.zeros(10))


def test_load_state_dict_checks_the_format(tmp_path):
    from safetensors.torch import save_file

    save_file({"a": torch.ones(2)}, str(tmp_path / "pt.safetensors"), metadata={"format": "pt"})
    save_file({"a": torch.ones(2)}, str(tmp_path / "tf.safetensors"), metadata={"format": "tf"})
    save_file({"a": torch.ones(2)}, str(tmp_path / "none.safetensors"))
    assert torch.equal(load_state_dict(str(tmp_path / "pt.safetensors"))["a"], torch.ones(2))
    assert torch.equal(load_state_dict(str(tmp_path / "none.safetensors"), device_map={"": "cpu"})["a"], torch.ones(2))
    with pytest.raises(CheckpointError, match="saved by tf; hasten loads PyTorch"):
        load_state_dict(str(tmp_path / "tf.safetensors"))
    torch.save({"b": torch.zeros(3)}, str(tmp_path / "w.bin"))
    assert torch.equal(load_state_dict(str(tmp_path / "w.bin"))["b"], torch.zeros(3))


@pytest.mark.parametrize("device_map", [None, {"": "cpu"}])
def test_checkpoint_weights_the_model_lacks_are_logged_in_accelerates_words(tmp_path, caplog, device_map):
    from hasten.utils import load_checkpoint_in_model

    state = nn.Linear(2, 2).state_dict()
    state["foo"] = torch.ones(3)
    path = tmp_path / "weights.pt"
    torch.save(state, path)
    with caplog.at_level("WARNING"):
        load_checkpoint_in_model(nn.Linear(2, 2), str(path), device_map=device_map)
    assert any("were not used when initializing Linear: ['foo']" in record.getMessage() for record in caplog.records)
    with pytest.raises((ValueError, RuntimeError)):
        load_checkpoint_in_model(nn.Linear(2, 2), str(path), device_map=device_map, strict=True)
