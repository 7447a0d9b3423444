"""hasten.distributed.operations: nested-structure helpers in one process, and every collective on 2 real processes."""

from __future__ import annotations

import pickle
import re
from collections import OrderedDict, namedtuple
from types import MappingProxyType

import pytest
import torch

import hasten.utils
from hasten.distributed import operations
from hasten.distributed.operations import (
    broadcast, broadcast_object_list, concatenate, convert_outputs_to_fp32, convert_to_fp32, find_batch_size,
    find_device, gather, gather_object, get_data_structure, get_shape, honor_type, ignorant_find_batch_size,
    initialize_tensors, is_namedtuple, listify, pad_across_processes, pad_input_tensors, recursively_apply, reduce,
    send_to_device, slice_tensors, split_for_process,
)
from hasten.state import PartialState
from launching import launch

Point = namedtuple("Point", ["x", "y"])


# -- structure helpers ------------------------------------------------------------------------------------------

def test_recursively_apply_keeps_every_container_type():
    data = {"a": [torch.ones(1), (torch.ones(2), "text")], "p": Point(torch.ones(1), 3), "o": OrderedDict(k=torch.ones(1))}
    out = recursively_apply(lambda t: t * 2, data)
    assert isinstance(out["a"], list) and isinstance(out["a"][1], tuple) and isinstance(out["p"], Point)
    assert isinstance(out["o"], OrderedDict)
    assert out["a"][0].item() == 2 and out["a"][1][0].tolist() == [2, 2] and out["p"].x.item() == 2
    assert out["a"][1][1] == "text" and out["p"].y == 3  # other leaves are kept as they are
    with pytest.raises(TypeError) as refused:
        recursively_apply(torch.tensor, ["text"], error_on_other_type=True)
    assert str(refused.value) == ("Unsupported types (<class 'str'>) passed to `tensor`. Only nested list/tuple/dicts "
                                  "of objects that are valid for `is_torch_tensor` should be passed.")
    ints = recursively_apply(lambda v: v + 1, {"n": [1, 2]}, test_type=lambda v: isinstance(v, int))
    assert ints == {"n": [2, 3]}


def test_recursively_apply_on_a_read_only_mapping():
    out = recursively_apply(lambda t: t + 1, MappingProxyType({"a": torch.zeros(1)}))
    assert out["a"].item() == 1


def test_send_to_device_moves_everything_with_a_to_method():
    class Batch:  # like transformers' BatchEncoding: has .to without non_blocking
        def __init__(self):
            self.moved_to = None

        def to(self, device):
            self.moved_to = device
            return self

    batch = Batch()
    data = {"x": torch.ones(2), "meta": {"keep": torch.ones(1), "name": "n"}, "pair": Point(torch.ones(1), batch)}
    out = send_to_device(data, "meta", skip_keys="keep")
    assert out["x"].device.type == "meta" and out["pair"].x.device.type == "meta"
    assert out["meta"]["keep"].device.type == "cpu" and out["meta"]["name"] == "n"
    assert isinstance(out["pair"], Point) and batch.moved_to == "meta"
    out = send_to_device([torch.ones(1), {"a": torch.ones(1), "b": torch.ones(1)}], "meta", skip_keys=["a", "b"])
    assert out[0].device.type == "meta" and out[1]["a"].device.type == "cpu"
    assert send_to_device(5, "meta") == 5


def test_convert_to_fp32_only_touches_half_precision():
    data = {"h": torch.ones(1, dtype=torch.float16), "b": [torch.ones(1, dtype=torch.bfloat16)],
            "i": torch.ones(1, dtype=torch.int32), "d": Point(torch.ones(1, dtype=torch.float64), "s")}
    out = convert_to_fp32(data)
    assert out["h"].dtype == torch.float32 and out["b"][0].dtype == torch.float32
    assert out["i"].dtype == torch.int32 and out["d"].x.dtype == torch.float64 and out["d"].y == "s"


def test_convert_outputs_to_fp32_wraps_a_forward():
    def forward(x):
        return {"logits": x.half()}

    wrapped = convert_outputs_to_fp32(forward)
    assert wrapped(torch.ones(2))["logits"].dtype == torch.float32
    assert wrapped.__wrapped__ is forward
    with pytest.raises(pickle.PicklingError, match="unwrap_model"):
        pickle.dumps(wrapped)


def test_concatenate_nested_batches():
    batches = [{"x": torch.zeros(2, 3), "y": (torch.zeros(2),)}, {"x": torch.ones(1, 3), "y": (torch.ones(1),)}]
    out = concatenate(batches)
    assert out["x"].shape == (3, 3) and isinstance(out["y"], tuple) and out["y"][0].tolist() == [0, 0, 1]
    assert concatenate([torch.zeros(2, 1), torch.zeros(2, 1)], dim=1).shape == (2, 2)
    assert concatenate(["only"]) == "only"
    with pytest.raises(TypeError, match="Can only concatenate tensors"):
        concatenate(["a", "b"])


def test_find_batch_size():
    assert find_batch_size({"ids": [torch.zeros(4, 2)], "mask": torch.zeros(9)}) == 4
    assert find_batch_size((Point(torch.zeros(3), None),)) == 3
    with pytest.raises(ValueError, match="empty"):
        find_batch_size([])
    with pytest.raises(TypeError, match="tensors"):
        find_batch_size(["text"])
    assert ignorant_find_batch_size({}) is None and ignorant_find_batch_size(7) is None


def test_small_helpers():
    data = {"a": torch.zeros(2, 3, dtype=torch.float16), "b": [torch.arange(4)]}
    structure = get_data_structure(data)
    rebuilt = initialize_tensors(structure)
    assert rebuilt["a"].shape == (2, 3) and rebuilt["a"].dtype == torch.float16 and rebuilt["b"][0].shape == (4,)
    assert get_shape(data) == {"a": [2, 3], "b": [[4]]}
    assert listify({"x": torch.tensor([1.5], dtype=torch.bfloat16)}) == {"x": [1.5]}
    assert slice_tensors(data, slice(0, 1))["b"][0].tolist() == [0]
    assert find_device([None, {"k": torch.zeros(1)}]) == torch.device("cpu") and find_device(["x"]) is None
    assert honor_type(Point(1, 2), iter([3, 4])) == Point(3, 4) and is_namedtuple(Point(1, 2))
    assert not is_namedtuple((1, 2))
    padded = pad_input_tensors(torch.ones(5, 2), batch_size=5, num_processes=4)
    assert padded.shape == (8, 2) and padded[5:].sum() == 0


# -- split_between_processes' rule, for any number of processes ------------------------------------------------

@pytest.mark.parametrize(
    ("length", "processes", "expected"),
    [(7, 3, [[0, 1, 2], [3, 4], [5, 6]]), (3, 2, [[0, 1], [2]]), (2, 3, [[0], [1], []]), (6, 3, [[0, 1], [2, 3], [4, 5]])],
)
def test_split_rule(length, processes, expected):
    shares = [split_for_process(list(range(length)), i, processes, False) for i in range(processes)]
    assert shares == expected
    tensors = [split_for_process(torch.arange(length), i, processes, False).tolist() for i in range(processes)]
    assert tensors == expected


def test_split_padding_repeats_the_last_element_of_the_whole_input():
    assert [split_for_process(list("ABCDEFG"), i, 3, True) for i in range(3)] == [
        ["A", "B", "C"], ["D", "E", "G"], ["F", "G", "G"]]
    assert [split_for_process(("a", "b"), i, 3, True) for i in range(3)] == [("a",), ("b",), ("b",)]
    share = split_for_process(torch.arange(5).reshape(5, 1), 1, 2, True)
    assert share.tolist() == [[3], [4], [4]]


def test_split_dict_values_and_mismatched_lengths():
    share = split_for_process({"a": [1, 2, 3], "b": torch.tensor([4, 5, 6])}, 1, 2, False)
    assert share["a"] == [3] and share["b"].tolist() == [6]
    with pytest.raises(ValueError, match="same length"):
        split_for_process({"a": [1], "b": [1, 2]}, 0, 2, False)


# -- collectives in one process ---------------------------------------------------------------------------------

def test_collectives_in_one_process_are_identities():
    state = PartialState()
    assert not state.use_distributed
    t = torch.arange(3)
    assert gather(t) is t and broadcast(t) is t and pad_across_processes(t) is t
    assert gather_object({"a": 1}) == {"a": 1}  # returned as is, not wrapped
    reduced = reduce(t.float(), "sum")
    assert reduced is not t and reduced.tolist() == [0, 1, 2]
    objs = [1, "two"]
    assert broadcast_object_list(objs) is objs
    assert operations.copy_tensor_to_devices(t) is t
    with state.split_between_processes([1, 2, 3]) as share:
        assert share == [1, 2, 3]


def test_utils_index_reexports_operations():
    for name in operations.__all__:
        assert getattr(hasten.utils, name) is getattr(operations, name)
    from hasten.utils import operations as utils_operations

    assert utils_operations.gather is gather


# -- every collective on real processes -------------------------------------------------------------------------

def _passed(stdout: str) -> dict:
    return {int(r): int(n) for r, n in re.findall(r"CHECKS-PASSED (\d+) (\d+)", stdout)}


def test_collectives_on_two_processes_in_debug_mode():
    """gather/gather_object/reduce/broadcast/broadcast_object_list/pad/copy on 2 ranks; mismatches raise."""
    result = launch("core_collectives.py", flags=["--debug"])
    passed = _passed(result.stdout)
    assert set(passed) == {0, 1}, result.stdout
    assert min(passed.values()) >= 45  # includes the debug-mode mismatch checks


def test_collectives_script_in_one_launched_process():
    result = launch("core_collectives.py", num_processes=1)
    assert set(_passed(result.stdout)) == {0}, result.stdout
