"""hasten.inference.prepare_pippy: split points in one process, and a 2-stage pipeline on 2 real processes
that gives the same output as the whole model in one process."""

from __future__ import annotations

import re

import pytest
import torch

from hasten.core.errors import ConfigError
from hasten.inference import find_pippy_batch_size, generate_device_map, generate_split_points, prepare_pippy
from launching import launch


class Block(torch.nn.Module):
    def __init__(self, width=8):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)

    def forward(self, x):
        return x + self.lin(x)


class Net(torch.nn.Module):
    def __init__(self, depth=4):
        super().__init__()
        self.embed = torch.nn.Linear(4, 8)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(depth))
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_split_points_balance_parameter_bytes_and_keep_blocks_whole():
    model = Net(4)
    assert generate_split_points(model, 2) == ["blocks.2"]
    assert len(generate_split_points(model, 3)) == 2
    # five pieces can make at most five stages; each piece then begins one
    assert generate_split_points(model, 6) == ["blocks.0", "blocks.1", "blocks.2", "blocks.3", "head"]
    with pytest.raises(ConfigError, match="only 6 splittable modules"):
        generate_split_points(model, 7)
    # a class named in no_split_module_classes is never cut inside (the root itself is never a piece)
    nested = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()))
    assert list(generate_device_map(nested, 2)) == ["0", "1.0", "1.1"]
    assert list(generate_device_map(nested, 2, no_split_module_classes=["Sequential"])) == ["0", "1"]


def test_device_map_assigns_each_piece_to_a_stage_in_order():
    device_map = generate_device_map(Net(4), 2)
    assert list(device_map.values()) == sorted(device_map.values()) and set(device_map.values()) == {0, 1}


@pytest.mark.parametrize("processes", [1, 2, 3, 5])
def test_generate_device_map_num_processes_is_the_number_of_stages(processes):
    """generate_device_map(model, num_processes=n): n stages, 0..n-1, in order."""
    device_map = generate_device_map(Net(4), num_processes=processes)
    assert sorted(set(device_map.values())) == list(range(processes))
    assert list(device_map.values()) == sorted(device_map.values())



def test_device_map_max_memory_fills_each_process_within_its_budget():
    model = Net(4)
    sizes = {n: sum(p.numel() * p.element_size() for p in m.parameters()) for n, m in model.named_modules() if n}
    device_map = generate_device_map(model, 2, max_memory={0: 10**9, 1: "1GB"})
    assert set(device_map.values()) == {0}  # everything fits the first budget: nothing moves on
    budget = sizes["embed"] + sizes["blocks.0"]
    device_map = generate_device_map(model, 2, max_memory={0: budget, 1: 10**9})
    assert [n for n, stage in device_map.items() if stage == 0] == ["embed", "blocks.0"]
    with pytest.raises(ConfigError, match="fits in no process's max_memory"):
        generate_device_map(model, 2, max_memory={0: 1, 1: 1})


def test_batch_size_is_found_in_args_then_kwargs():
    assert find_pippy_batch_size((torch.ones(5, 2),), None) == 5
    assert find_pippy_batch_size((), {"input_ids": torch.ones(3, 2)}) == 3
    assert find_pippy_batch_size(("text",), {}) is None


def test_one_process_runs_the_plain_forward():
    model = Net(2).eval()
    x = torch.randn(4, 4)
    expected = model(x)
    prepare_pippy(model, example_args=(x,))
    assert model.pippy_stage is None and torch.allclose(model(x), expected)
    with pytest.raises(ConfigError, match="example_args"):
        prepare_pippy(Net(2), example_args=())


def test_two_stage_pipeline_matches_one_process():
    result = launch("pippy_inference.py")
    passed = dict(re.findall(r"CHECKS-PASSED (\d) (\d+)", result.stdout))
    assert passed == {"0": "7", "1": "8"}, result.stdout + result.stderr
