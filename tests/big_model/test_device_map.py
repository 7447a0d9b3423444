"""Device maps: the maps Accelerate 1.15 computes, sizes, budgets, and the errors for bad maps.

EXPECTED_MAPS / EXPECTED_BALANCED are Accelerate's results for the cases in device_map_cases.py, written
down once by scripts/device_map_expectations.py (this test does not need Accelerate installed).
"""

from __future__ import annotations

import copy
import logging
import warnings

import pytest
import torch

from big_model_zoo import MODELS, TinyLM
from device_map_cases import BALANCED_CASES, MAP_CASES
from hasten.core.errors import DeviceMapError
from hasten.utils import (
    check_device_map,
    clean_device_map,
    compute_module_sizes,
    convert_file_size_to_int,
    dtype_byte_size,
    find_tied_parameters,
    get_balanced_memory,
    get_max_layer_size,
    get_max_memory,
    infer_auto_device_map,
)

EXPECTED_MAPS = [
    {'': 'cpu'},
    {'': 0},
    {'embed': 0, 'head': 0, 'blocks.0': 0, 'blocks.1.norm': 0, 'blocks.1.attn': 'cpu', 'blocks.1.mlp': 'cpu', 'blocks.2.norm': 'cpu', 'blocks.2.attn': 'cpu', 'blocks.2.mlp.up': 'cpu', 'blocks.2.mlp.down': 'disk', 'blocks.3': 'disk', 'norm': 'disk'},
    {'embed': 0, 'head': 0, 'blocks.0': 'cpu', 'blocks.1': 'disk', 'blocks.2': 'disk', 'blocks.3': 'disk', 'norm': 'disk'},
    {'embed': 1, 'head': 1, 'blocks.0': 'cpu', 'blocks.1': 'cpu', 'blocks.2': 'disk', 'blocks.3': 'disk', 'norm': 'disk'},
    {'embed': 0, 'head': 0, 'blocks.0.norm': 0, 'blocks.0.attn': 0, 'blocks.1.norm': 1, 'blocks.1.attn': 1, 'blocks.1.mlp.up': 1, 'blocks.1.mlp.down': 'cpu', 'blocks.2': 'cpu', 'blocks.3': 'cpu', 'norm': 'cpu', 'blocks.0.mlp': 1},
    {'embed': 1, 'head': 1, 'norm': 'disk', 'blocks': 'disk'},
    {'embed': 1, 'head': 1, 'norm': 'disk', 'blocks': 'disk'},
    {'embed': 1, 'head': 1, 'blocks.0': 'cpu', 'blocks.1': 'cpu', 'blocks.2': 'disk', 'blocks.3': 'disk', 'norm': 'disk'},
    {'embed': 0, 'head': 0, 'blocks.0': 0, 'blocks.1': 'cpu', 'blocks.2': 'cpu', 'blocks.3': 'cpu', 'norm': 'cpu'},
    {'embed': 0, 'head': 0, 'blocks.0': 0, 'blocks.1': 'cpu', 'blocks.2': 'cpu', 'blocks.3': 'cpu', 'norm': 'cpu'},
    {'': 1},
    {'': 1},
    {'embed': 1, 'head': 1, 'norm': 'disk', 'blocks': 'disk'},
    {'embed': 1, 'blocks.0': 'cpu', 'blocks.1': 'cpu', 'blocks.2': 'disk', 'blocks.3': 'disk', 'norm': 'disk', 'head': 'disk'},
    {'embed': 0, 'blocks.0.norm': 0, 'blocks.0.attn': 0, 'blocks.0.mlp.up': 0, 'blocks.0.mlp.down': 'cpu', 'blocks.1.norm': 'cpu', 'blocks.1.attn': 'cpu', 'blocks.2': 'disk', 'blocks.3': 'disk', 'norm': 'disk', 'head': 'disk', 'blocks.1.mlp': 'disk'},
    {'scale': 0, 'linear1': 0, 'batchnorm': 'cpu', 'linear2': 'cpu', 'offset': 'cpu'},
    {'scale': 0, 'linear1': 1, 'batchnorm': 1, 'linear2': 'cpu', 'offset': 'cpu'},
    {'': 'disk'},
    {'scale': 'cpu', 'linear1': 'disk', 'batchnorm': 'disk', 'linear2': 'disk', 'offset': 'disk'},
    {'first': 0, 'middle.0.0': 1, 'middle.0.1': 1, 'middle.0.2': 'cpu', 'middle.1': 'cpu', 'last': 'cpu'},
    {'': 0},
    {'first': 1, 'middle': 'cpu', 'last': 'cpu'},
    {'': 'disk'},
    {'0': 0, '1': 1, '2': 1},
    {'0': 0, '1': 1, '2': 1},
    {'0': 'cpu', '1': 'disk', '2': 'disk'},
]

EXPECTED_BALANCED = [
    {0: 111100, 1: 900000, 'cpu': 10000000},
    {0: 0, 1: 111100, 2: 900000, 'cpu': 10000000},
    {0: 20000, 1: 1000000, 'cpu': 10000000},
    {0: 0, 1: 20000, 2: 1000000, 'cpu': 10000000},
    {0: 7470, 1: 1000000, 'cpu': 10000000},
    {0: 10000, 1: 19630, 2: 30000, 'cpu': 10000000},
    {0: 1000000, 'cpu': 10000000},
    {'cpu': 10000000},
]



@pytest.fixture(autouse=True)
def _quiet():
    # Integer GPU ids on a machine without GPUs log "Device 0 is not available" (as Accelerate does).
    logging.getLogger("hasten.big_model.device_map").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.mark.parametrize("index", range(len(MAP_CASES)))
def test_infer_auto_device_map_gives_accelerates_map(index):
    model_name, kwargs = MAP_CASES[index]
    result = infer_auto_device_map(MODELS[model_name](), **copy.deepcopy(kwargs))
    assert dict(result) == EXPECTED_MAPS[index]


@pytest.mark.parametrize("index", range(len(BALANCED_CASES)))
def test_get_balanced_memory_gives_accelerates_budgets(index):
    model_name, kwargs = BALANCED_CASES[index]
    assert get_balanced_memory(MODELS[model_name](), **copy.deepcopy(kwargs)) == EXPECTED_BALANCED[index]


def _device_of(name, device_map):
    while name not in device_map:
        name = name.rsplit(".", 1)[0] if "." in name else ""
    return device_map[name]


@pytest.mark.parametrize("index", [i for i, (name, _) in enumerate(MAP_CASES) if name == "tiny_lm"])
def test_tied_parameters_never_land_on_different_devices(index):
    _, kwargs = MAP_CASES[index]
    model = TinyLM()
    result = infer_auto_device_map(model, **copy.deepcopy(kwargs))
    for group in find_tied_parameters(model):
        assert len({_device_of(name, result) for name in group}) == 1, (group, result)


def test_maps_work_on_meta_models_and_keep_order():
    from hasten import init_empty_weights

    with init_empty_weights():
        model = TinyLM()
    assert model.embed.weight.is_meta and model.head.weight is model.embed.weight  # the tie survives
    result = infer_auto_device_map(model, max_memory={0: 12000, "cpu": 12000}, no_split_module_classes=["Block"])
    assert list(result) == ["embed", "head", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "norm"]


def test_sizes_dtypes_and_layers():
    model = TinyLM()
    sizes = compute_module_sizes(model)
    assert sizes[""] == sum(p.numel() * 4 for p in model.parameters())  # the tied weight counted once
    assert sizes["blocks.0.attn"] == (16 * 16 + 16) * 4
    half = compute_module_sizes(model, dtype=torch.float16)
    assert half[""] * 2 == sizes[""]
    special = compute_module_sizes(model, dtype="float16", special_dtypes={"embed.weight": torch.float32})
    assert special["embed"] == sizes["embed"]
    buffers = MODELS["with_buffers"]()
    # int64 counters keep their size when the floats are counted at fp16
    assert compute_module_sizes(buffers, dtype=torch.float16)["batchnorm.num_batches_tracked"] == 8
    assert get_max_layer_size(list(model.named_children()), sizes, ["Block"]) == (sizes["blocks.0"],
                                                                                 [f"blocks.{i}" for i in range(4)])
    assert dtype_byte_size(torch.bool) == 1 / 8 and dtype_byte_size(torch.bfloat16) == 2
    assert dtype_byte_size(torch.float8_e4m3fn) == 1 and dtype_byte_size(torch.int64) == 8


@pytest.mark.parametrize("text, expected", [
    ("1MiB", 2**20), ("2GiB", 2 * 2**30), ("1.5KB", 1500), ("10GB", 10**10), ("8Mb", 10**6), ("3kib", 3 * 1024),
    (1234, 1234),
])
def test_convert_file_size_to_int(text, expected):
    assert convert_file_size_to_int(text) == expected


@pytest.mark.parametrize("bad", ["ten", "5XB", "GB", -1])
def test_bad_sizes_are_refused_with_the_fix(bad):
    with pytest.raises(DeviceMapError, match="integer number of bytes|>= 0"):
        convert_file_size_to_int(bad)


def test_get_max_memory_orders_and_checks_devices():
    assert list(get_max_memory({"cpu": "1KB", 1: 10, "disk": 5, 0: "1KiB"}).items()) == [
        (0, 1024), (1, 10), ("cpu", 1000), ("disk", 5)]
    with pytest.raises(DeviceMapError, match="unknown device.*'gpu0'.*integers for GPUs"):
        get_max_memory({"gpu0": 10})
    with pytest.raises(DeviceMapError, match="max_memory\\['cpu'\\] is -5"):
        get_max_memory({"cpu": -5})
    measured = get_max_memory()
    assert measured["cpu"] > 0 and set(measured) <= {"cpu", "mps"} | set(range(torch.cuda.device_count()))


def test_clean_device_map_merges_uniform_subtrees():
    assert dict(clean_device_map({"a.x": 0, "a.y": 0, "b": 1})) == {"a": 0, "b": 1}
    assert dict(clean_device_map({"a.x": 0, "a.y": 0, "b": 0})) == {"": 0}
    assert dict(clean_device_map({"a.x": 0, "a.y": 1, "b": 1})) == {"a.x": 0, "a.y": 1, "b": 1}


def test_check_device_map_names_the_missing_pieces():
    model = TinyLM()
    check_device_map(model, {"": "cpu"})
    check_device_map(model, {"embed": 0, "blocks": "cpu", "norm": "disk", "head.weight": "cpu"})
    with pytest.raises(DeviceMapError, match=r"no device for 2 weight\(s\): norm.weight, norm.bias; add their modules"):
        check_device_map(model, {"embed": 0, "blocks": "cpu", "head": "cpu"})
    # keys that name nothing warn, in Accelerate's words, and place nothing (Accelerate warns too)
    with pytest.warns(UserWarning, match=r"device_map keys do not match any submodules in the model: \['decoder'\]"):
        check_device_map(model, {"decoder": 0, "": "cpu"})
    with pytest.warns(UserWarning, match="decoder"), pytest.raises(DeviceMapError, match="no device for"):
        check_device_map(model, {"decoder": 0, "embed": 0})


def test_check_device_map_unknown_keys_are_an_error_under_strict(monkeypatch):
    monkeypatch.setenv("HASTEN_STRICT", "1")
    model = TinyLM()
    with pytest.raises(DeviceMapError, match=r"device_map keys \['decoder'\] name no module of the model \(TinyLM\), "
                                             r"whose top-level modules are \['embed', 'blocks', 'norm', 'head'\]; fix or "
                                             r"remove them") as caught:
        check_device_map(model, {"decoder": 0, "": "cpu"})
    assert isinstance(caught.value, ValueError) and "\n" not in str(caught.value)
    check_device_map(model, {"embed": 0, "blocks": "cpu", "norm": "disk", "head.weight": "cpu"})  # valid maps pass


def test_find_tied_parameters():
    assert find_tied_parameters(TinyLM()) == [["embed.weight", "head.weight"]]
    assert find_tied_parameters(TinyLM(tie=False)) == []


def test_a_budget_that_fits_no_module_is_a_warning_unless_fallback_allocation_fills_it(caplog):
    from collections import OrderedDict

    inner = torch.nn.Sequential(OrderedDict([("first", torch.nn.Linear(10, 4)), ("second", torch.nn.Linear(4, 4)),
                                             ("third", torch.nn.Linear(4, 8))]))
    model = torch.nn.Sequential(OrderedDict([("block", inner)]))
    with caplog.at_level(logging.WARNING, logger="hasten.big_model.device_map"):
        plain = infer_auto_device_map(model, max_memory={"cpu": 256})
    assert set(plain.values()) == {"disk"}
    assert any("insufficient memory" in r.getMessage() and "cpu" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hasten.big_model.device_map"):
        filled = infer_auto_device_map(model, max_memory={"cpu": 256}, fallback_allocation=True)
    assert filled == {"block.second": "cpu", "block.first": "disk", "block.third": "disk"}
    assert not any("insufficient memory" in r.getMessage() for r in caplog.records)
