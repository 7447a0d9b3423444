"""Offloaded weights: Accelerate's .dat/index format, safetensors read in place, the loader and prefetching."""

from __future__ import annotations

import json
import os

import pytest
import torch

from hasten.core.errors import OffloadError
from hasten.big_model.offload import MappedSafetensors, mapped_safetensors, safetensors_offload_entry
from hasten.utils import (
    OffloadedWeightsLoader,
    PrefixedDataset,
    extract_submodules_state_dict,
    load_offloaded_weight,
    offload_state_dict,
    offload_weight,
    save_offload_index,
)


@pytest.mark.parametrize("tensor", [
    torch.arange(12, dtype=torch.float32).reshape(3, 4),
    torch.randn(5).to(torch.bfloat16),
    torch.tensor(3.5),
    torch.randint(-5, 5, (2, 3), dtype=torch.int64),
    torch.randn(4).to(torch.float8_e4m3fn),
])
def test_offload_weight_round_trips(tmp_path, tensor):
    index = offload_weight(tensor, "layer.weight", str(tmp_path), index={})
    info = index["layer.weight"]
    assert info["shape"] == list(tensor.shape)
    back = load_offloaded_weight(str(tmp_path / "layer.weight.dat"), info)
    assert back.dtype == tensor.dtype and back.shape == tensor.shape
    assert torch.equal(back.view(torch.uint8), tensor.view(torch.uint8)) if tensor.dim() else back.item() == tensor.item()


def test_loaded_weights_are_private_copies_of_the_file(tmp_path):
    offload_state_dict(str(tmp_path), {"w": torch.zeros(4)})
    info = json.loads((tmp_path / "index.json").read_text())["w"]
    first = load_offloaded_weight(str(tmp_path / "w.dat"), info)
    first += 1  # copy-on-write: neither the file nor a second read sees it
    assert torch.equal(load_offloaded_weight(str(tmp_path / "w.dat"), info), torch.zeros(4))


def test_offload_index_merges_and_state_dict_writes_everything(tmp_path):
    save_offload_index({"a": {"dtype": "float32", "shape": [1]}}, str(tmp_path))
    save_offload_index({"b": {"dtype": "int64", "shape": []}}, str(tmp_path))
    save_offload_index({}, str(tmp_path))
    assert json.loads((tmp_path / "index.json").read_text()) == {
        "a": {"dtype": "float32", "shape": [1]}, "b": {"dtype": "int64", "shape": []}}
    folder = tmp_path / "sd"
    offload_state_dict(str(folder), {"x.weight": torch.ones(2, 2), "x.bias": torch.zeros(2)})
    assert sorted(os.listdir(folder)) == ["index.json", "x.bias.dat", "x.weight.dat"]
    loader = OffloadedWeightsLoader(save_folder=str(folder))
    assert list(loader) == ["x.weight", "x.bias"] and torch.equal(loader["x.weight"], torch.ones(2, 2))


def test_prefixed_dataset_and_extract():
    data = {"a.x": 1, "a.y": 2, "b.x": 3}
    view = PrefixedDataset(data, "a.")
    assert view["x"] == 1 and list(view) == ["a.x", "a.y"]
    assert len(view) == 3  # the whole mapping's length, as in Accelerate
    state = {"a": 0, "a.w": 1, "ab.w": 2, "b.c.w": 3}
    assert extract_submodules_state_dict(state, ["a", "b.c"]) == {"a": 0, "a.w": 1, "b.c.w": 3}


def _write_safetensors(path, tensors):
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": "pt"})


def test_safetensors_weights_are_read_in_place(tmp_path):
    path = tmp_path / "model.safetensors"
    tensors = {"a": torch.randn(3, 4), "b": torch.arange(6, dtype=torch.int64), "c": torch.randn(2).bfloat16()}
    _write_safetensors(path, tensors)
    mapped = MappedSafetensors(str(path))
    assert set(mapped.keys()) == set(tensors)
    base = mapped._bytes.data_ptr()
    for name, expected in tensors.items():
        view = mapped.tensor(name)
        assert torch.equal(view, expected)
        # a view of the mapping, not a copy
        assert base <= view.data_ptr() < base + os.path.getsize(path)
    before = path.read_bytes()
    mapped.tensor("a").zero_()  # private mapping: the file is untouched
    assert path.read_bytes() == before
    assert mapped_safetensors(path) is mapped_safetensors(str(path))


def test_damaged_safetensors_are_named(tmp_path):
    path = tmp_path / "bad.safetensors"
    _write_safetensors(path, {"a": torch.randn(100)})
    with open(path, "r+b") as handle:
        handle.truncate(os.path.getsize(path) - 40)
    with pytest.raises(OffloadError, match="bad.safetensors is truncated"):
        MappedSafetensors(str(path))
    path.write_bytes(b"\x02")
    with pytest.raises(OffloadError, match="not a safetensors file"):
        MappedSafetensors(str(path))


def test_loader_reads_index_entries_into_safetensors(tmp_path):
    path = tmp_path / "model.safetensors"
    _write_safetensors(path, {"layer.weight": torch.randn(4, 4), "layer.bias": torch.randn(4)})
    index = {"layer.weight": safetensors_offload_entry(str(path), "layer.weight"),
             "other.bias": safetensors_offload_entry(str(path), "layer.bias", dtype=torch.float16)}
    loader = OffloadedWeightsLoader(index=index, state_dict={"extra": torch.ones(1)})
    assert list(loader) == ["extra", "layer.weight", "other.bias"] and len(loader) == 3
    assert loader["other.bias"].dtype == torch.float16
    assert torch.equal(loader["layer.weight"], mapped_safetensors(path).tensor("layer.weight"))
    # prefetching: the cast happens on the background thread; each prefetched weight is handed out once
    loader.prefetch(["other.bias", "layer.weight"])
    assert set(loader._ready) == {"other.bias"}
    first = loader["other.bias"]
    assert "other.bias" not in loader._ready
    assert torch.equal(first, loader["other.bias"])
    loader.prefetch(["other.bias"])
    loader.prefetch(["layer.weight"])  # a new prefetch drops the unconsumed one: memory stays bounded
    assert loader._ready == {}


def test_loader_needs_a_source(tmp_path):
    with pytest.raises(OffloadError, match="needs a `state_dict`, a `save_folder` or an `index`"):
        OffloadedWeightsLoader()
    with pytest.raises(OffloadError, match="holds no index.json"):
        OffloadedWeightsLoader(save_folder=str(tmp_path))


def test_accelerate_reads_hasten_offload_folders_and_back(tmp_path):
    accelerate_offload = pytest.importorskip("accelerate.utils.offload")
    path = tmp_path / "model.safetensors"
    _write_safetensors(path, {"w": torch.randn(3, 3)})
    offload_state_dict(str(tmp_path / "ours"), {"x": torch.randn(2, 2).bfloat16()})
    save_offload_index({"w": safetensors_offload_entry(str(path), "w")}, str(tmp_path / "ours"))
    theirs = accelerate_offload.OffloadedWeightsLoader(save_folder=str(tmp_path / "ours"))
    ours = OffloadedWeightsLoader(save_folder=str(tmp_path / "ours"))
    assert all(torch.equal(theirs[k], ours[k]) for k in ("x", "w"))
    accelerate_offload.offload_state_dict(str(tmp_path / "acc"), {"y": torch.randn(3), "z": torch.tensor(2)})
    back = OffloadedWeightsLoader(save_folder=str(tmp_path / "acc"))
    acc_back = accelerate_offload.OffloadedWeightsLoader(save_folder=str(tmp_path / "acc"))
    assert all(torch.equal(back[k], acc_back[k]) for k in ("y", "z"))
