"""Regional compilation (hasten.training.compilation): each repeated block class is compiled once, outputs match eager,
and `Accelerator` honours `TorchDynamoPlugin(use_regional_compilation=True)` instead of compiling the whole model."""

from __future__ import annotations

import pytest
import torch

from hasten import Accelerator, TorchDynamoPlugin
from hasten.state import AcceleratorState, GradientState
from hasten.training.compilation import (
    compile_regions, compile_regions_in_place, has_compiled_regions, has_repeated_blocks, is_repeated_blocks,
)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.lin(x)) + x


class Net(torch.nn.Module):
    def __init__(self, depth):
        super().__init__()
        self.embed = torch.nn.Linear(4, 8)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(depth))
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class CountingBackend:
    """A dynamo backend that runs graphs eagerly and counts how many it was handed."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, graph_module, example_inputs):
        self.graphs += 1
        return graph_module.forward


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def graphs_compiled(compile_fn, depth):
    torch.manual_seed(0)
    model, backend = Net(depth), CountingBackend()
    x = torch.randn(3, 4)
    expected = model(x)
    compiled = compile_fn(model, backend=backend)
    assert torch.allclose(compiled(x), expected)
    assert torch.allclose(compiled(x), expected)  # the second call reuses the graphs
    torch._dynamo.reset()
    return backend.graphs


def test_repeated_block_detection():
    model = Net(3)
    assert is_repeated_blocks(model.blocks) and not is_repeated_blocks(model)
    assert not is_repeated_blocks(torch.nn.ModuleList([Block(), torch.nn.Linear(2, 2)]))
    assert not is_repeated_blocks(torch.nn.ModuleList())
    assert has_repeated_blocks(model) and not has_repeated_blocks(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("compile_fn", [compile_regions, compile_regions_in_place])
def test_each_block_class_compiles_once_whatever_the_depth(compile_fn):
    one, six = graphs_compiled(compile_fn, 1), graphs_compiled(compile_fn, 6)
    assert one >= 1
    assert six == one, f"6 blocks compiled {six} graphs, 1 block {one}: blocks were compiled one by one"


def test_whole_model_compilation_grows_with_depth_for_contrast():
    # torch.compile of the whole model traces every block into one graph: same count, but a bigger graph.
    sizes = []
    for depth in (1, 6):
        nodes = []
        model = Net(depth)
        torch.compile(model, backend=lambda gm, _: nodes.append(len(gm.graph.nodes)) or gm.forward)(torch.randn(3, 4))
        torch._dynamo.reset()
        sizes.append(sum(nodes))
    assert sizes[1] > sizes[0]


def test_compile_regions_leaves_the_original_alone_and_shares_weights():
    model = Net(3)
    compiled = compile_regions(model, backend="eager")
    assert compiled is not model and compiled._orig_mod is model
    assert "_orig_mod" not in dict(compiled.named_children())  # not listed as a submodule
    assert not has_compiled_regions(model) and has_compiled_regions(compiled)
    assert compiled.blocks[1]._orig_mod is model.blocks[1]
    assert set(map(id, compiled.parameters())) == set(map(id, model.parameters()))


def test_accelerator_compiles_regions_into_a_new_tree_on_one_device(tmp_path):
    """As Accelerate on one device (and DDP, FSDP1): `compile_regions`' new tree, `_orig_mod.` inside each compiled
    block's names; hasten's checkpoints still load into a model prepared without compilation, and back."""
    torch.manual_seed(0)
    model = Net(4)
    x = torch.randn(3, 4)
    expected = model(x).detach()
    keys = list(model.state_dict())
    accelerator = Accelerator(cpu=True, dynamo_plugin=TorchDynamoPlugin(backend="eager", use_regional_compilation=True))
    prepared = accelerator.prepare(model)
    assert prepared is not model and prepared.__dict__["_orig_mod"] is model
    assert all(type(block).__name__ == "OptimizedModule" for block in prepared.blocks)
    assert "blocks.0._orig_mod.lin.weight" in prepared.state_dict()
    assert not has_compiled_regions(model) and has_compiled_regions(prepared)
    assert torch.allclose(prepared(x), expected)
    assert accelerator.unwrap_model(prepared) is prepared  # keep_torch_compile=True keeps the compiled tree
    assert accelerator.unwrap_model(prepared, keep_torch_compile=False) is model
    assert list(accelerator.unwrap_model(prepared, keep_torch_compile=False).state_dict()) == keys
    accelerator.save_state(tmp_path / "compiled")
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    plain_accelerator = Accelerator(cpu=True)
    plain = plain_accelerator.prepare(Net(4))
    assert not has_compiled_regions(plain)
    plain_accelerator.load_state(tmp_path / "compiled")
    assert torch.allclose(plain(x), expected), "a checkpoint of the compiled tree did not load into a plain model"
    with torch.no_grad():
        for param in plain.parameters():
            param.add_(1.0)
    plain_accelerator.save_state(tmp_path / "plain")
    accelerator.load_state(tmp_path / "plain")  # and back: plain names into the compiled tree
    assert torch.allclose(prepared(x), plain(x))


def test_regions_compiled_in_place_before_prepare_are_left_as_they_are():
    # hasten's in-place form stays one call away (as prepare applies it under FSDP2/DeepSpeed): names unchanged
    torch.manual_seed(0)
    model = compile_regions_in_place(Net(4), backend="eager")
    keys = list(model.state_dict())
    accelerator = Accelerator(cpu=True, dynamo_plugin=TorchDynamoPlugin(backend="eager", use_regional_compilation=True))
    prepared = accelerator.prepare(model)
    assert prepared is model and all(block._compiled_call_impl is not None for block in prepared.blocks)
    assert list(prepared.state_dict()) == keys


def test_accelerator_without_the_flag_compiles_the_whole_model():
    model = Net(2)
    accelerator = Accelerator(cpu=True, dynamo_plugin=TorchDynamoPlugin(backend="eager"))
    prepared = accelerator.prepare(model)
    assert isinstance(prepared, torch._dynamo.eval_frame.OptimizedModule)
    assert not any(block._compiled_call_impl is not None for block in model.blocks)


def test_launcher_environment_turns_regional_compilation_on(monkeypatch):
    # what `hasten launch --dynamo_backend eager --dynamo_use_regional_compilation` exports to each process
    monkeypatch.setenv("HASTEN_DYNAMO_BACKEND", "eager")
    monkeypatch.setenv("HASTEN_DYNAMO_USE_REGIONAL_COMPILATION", "true")
    model = Net(2)
    prepared = Accelerator(cpu=True).prepare(model)
    assert prepared.__dict__["_orig_mod"] is model and has_compiled_regions(prepared)
