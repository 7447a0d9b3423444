"""Each option of `dispatch_model` and `load_checkpoint_and_dispatch` is seen on the hooks it attaches, on where
the weights live, or on what the forward computes (CPU-only: "disk" and the meta device stand in for a GPU)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from big_model_zoo import Block, TinyLM, WithBuffers
from hasten import dispatch_model, init_empty_weights, load_checkpoint_and_dispatch
from hasten.big_model.offload import offload_state_dict
from hasten.core.errors import CheckpointError, NotSupportedYetError

IDS = torch.tensor([[1, 5, 9, 63, 0], [2, 2, 40, 7, 11]])
HALF_ON_DISK = {"embed": "cpu", "blocks.0": "cpu", "blocks.1": "disk", "blocks.2": "disk", "blocks.3": "cpu",
                "norm": "disk", "head": "cpu"}


@pytest.fixture(scope="module")
def reference():
    torch.manual_seed(0)
    return TinyLM().eval()


@pytest.fixture(scope="module")
def checkpoint(reference, tmp_path_factory):
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("ckpt")
    state = {k: v.contiguous() for k, v in reference.state_dict().items() if k != "head.weight"}  # tied, stored once
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return str(folder)


def _empty(cls=TinyLM):
    with init_empty_weights():
        return cls().eval()


def _real(reference):
    model = TinyLM().eval()
    model.load_state_dict(reference.state_dict())
    return model


def test_force_hooks_attach_hooks_to_a_one_device_map(reference, checkpoint):
    assert not hasattr(dispatch_model(_real(reference), {"": "cpu"}), "_hf_hook")
    forced = dispatch_model(_real(reference), {"": "cpu"}, force_hooks=True)
    assert forced._hf_hook.execution_device == "cpu" and forced._hf_hook.io_same_device
    loaded = load_checkpoint_and_dispatch(_empty(), checkpoint, device_map={"": "cpu"}, force_hooks=True)
    assert hasattr(loaded, "_hf_hook") and torch.allclose(loaded(IDS), reference(IDS))
    plain = load_checkpoint_and_dispatch(_empty(), checkpoint, device_map={"": "cpu"})
    assert not hasattr(plain, "_hf_hook")


@pytest.mark.parametrize("entry", ["dispatch_model", "load_checkpoint_and_dispatch"])
def test_offload_buffers_keeps_the_buffers_of_offloaded_modules_off_the_device(tmp_path, entry):
    torch.manual_seed(0)
    source = WithBuffers().eval()
    source.batchnorm.running_mean += 3
    from safetensors.torch import save_file

    save_file(source.state_dict(), str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    device_map = {"scale": "cpu", "linear1": "cpu", "batchnorm": "disk", "linear2": "cpu", "offset": "cpu"}
    x = torch.randn(4, 3)
    for offload_buffers, where in ((False, "cpu"), (True, "meta")):
        folder = str(tmp_path / f"off-{offload_buffers}")
        if entry == "dispatch_model":
            model = WithBuffers().eval()
            model.load_state_dict(source.state_dict())
            model = dispatch_model(model, device_map, offload_dir=folder, offload_buffers=offload_buffers)
        else:
            model = load_checkpoint_and_dispatch(_empty(WithBuffers), str(tmp_path), device_map=device_map,
                                                 offload_folder=folder, offload_buffers=offload_buffers)
        assert model.batchnorm.running_mean.device.type == where, (entry, offload_buffers)
        assert model.batchnorm._hf_hook.offload_buffers is offload_buffers
        assert torch.allclose(model(x), source(x))


def test_skip_keys_reach_every_hook(reference, checkpoint, tmp_path):
    model = dispatch_model(_real(reference), HALF_ON_DISK, offload_dir=str(tmp_path / "a"), skip_keys=["cache"])
    hooks = [m._hf_hook for m in model.modules() if hasattr(m, "_hf_hook")]
    assert hooks and all(h.skip_keys == ["cache"] for h in hooks)
    loaded = load_checkpoint_and_dispatch(_empty(), checkpoint, device_map=HALF_ON_DISK,
                                          offload_folder=str(tmp_path / "b"), skip_keys="cache")
    assert all(m._hf_hook.skip_keys == "cache" for m in loaded.modules() if hasattr(m, "_hf_hook"))
    default = dispatch_model(_real(reference), HALF_ON_DISK, offload_dir=str(tmp_path / "c"))
    assert all(m._hf_hook.skip_keys is None for m in default.modules() if hasattr(m, "_hf_hook"))


def test_preload_module_classes_load_a_whole_block_at_its_own_forward(reference, checkpoint, tmp_path):
    per_layer = dispatch_model(_real(reference), HALF_ON_DISK, offload_dir=str(tmp_path / "a"))
    assert hasattr(per_layer.blocks[1].attn, "_hf_hook")  # each leaf fetches its own weights
    for model in (
        dispatch_model(_real(reference), HALF_ON_DISK, offload_dir=str(tmp_path / "b"),
                       preload_module_classes=["Block"]),
        load_checkpoint_and_dispatch(_empty(), checkpoint, device_map=HALF_ON_DISK,
                                     offload_folder=str(tmp_path / "c"), preload_module_classes=["Block"]),
    ):
        block = model.blocks[1]
        assert isinstance(block, Block) and block._hf_hook.offload and block._hf_hook.place_submodules
        assert not hasattr(block.attn, "_hf_hook") and not hasattr(block.mlp.up, "_hf_hook")
        assert block.attn.weight.device.type == "meta"
        assert torch.allclose(model(IDS), reference(IDS))


def test_main_device_is_where_offloaded_modules_run(reference):
    default = dispatch_model(_real(reference), {"embed": "cpu", "blocks": "cpu", "norm": "cpu", "head": "cpu"},
                             force_hooks=True)
    assert default._hf_hook.execution_device == "cpu" and default.blocks[0].attn.weight.device.type == "cpu"
    # With another main device, the modules mapped to "cpu" are offloaded: their weights leave the module and are
    # brought to the main device for their forward.
    moved = dispatch_model(_real(reference), {"embed": "cpu", "blocks": "cpu", "norm": "cpu", "head": "cpu"},
                           main_device="meta", force_hooks=True)
    assert moved._hf_hook.execution_device == "meta" and moved.blocks[0]._hf_hook.execution_device == "meta"
    assert moved.blocks[0].attn.weight.device.type == "meta" and moved.blocks[0].attn._hf_hook.offload
    fetched = moved.blocks[0].attn._hf_hook.weights_map["weight"]  # what the forward brings to the main device
    assert torch.equal(fetched, reference.blocks[0].attn.weight)


def test_state_dict_is_where_offloaded_weights_come_from(reference, tmp_path):
    state = reference.state_dict()
    model = dispatch_model(_empty(), {"": "disk"}, state_dict=state, offload_dir=str(tmp_path), offload_index={})
    assert torch.allclose(model(IDS), reference(IDS))
    doubled = {k: v * 2 + 1 if k == "blocks.0.attn.bias" else v for k, v in state.items()}
    other = dispatch_model(_empty(), {"": "disk"}, state_dict=doubled, offload_dir=str(tmp_path), offload_index={})
    assert not torch.allclose(other(IDS), reference(IDS))
    assert not os.listdir(tmp_path)  # nothing was written: every weight came from state_dict


def test_offload_index_names_the_weights_already_in_the_folder(reference, tmp_path):
    offload_state_dict(str(tmp_path), reference.state_dict())
    index = json.loads((tmp_path / "index.json").read_text())
    (tmp_path / "index.json").unlink()
    model = dispatch_model(_empty(), {"": "disk"}, offload_dir=str(tmp_path), offload_index=index)
    assert torch.allclose(model(IDS), reference(IDS))
    assert not (tmp_path / "index.json").exists()  # read from the given index, nothing re-offloaded
    only_index = dispatch_model(_empty(), {"": "disk"}, offload_dir=str(tmp_path), offload_index=index,
                                main_device="cpu")
    assert only_index.blocks[0].attn._hf_hook.weights_map is not None


def test_strict_refuses_a_checkpoint_that_does_not_match(reference, tmp_path):
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in reference.state_dict().items() if k not in ("norm.bias", "head.weight")}
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    loaded = load_checkpoint_and_dispatch(TinyLM().eval(), str(tmp_path), device_map={"": "cpu"})  # logs, loads
    assert torch.equal(loaded.embed.weight, reference.embed.weight)
    with pytest.raises(CheckpointError, match=r"missing keys \['norm.bias'\]"):
        load_checkpoint_and_dispatch(TinyLM().eval(), str(tmp_path), device_map={"": "cpu"}, strict=True)


def test_full_state_dict_and_broadcast_from_rank0_are_refused_in_one_line(checkpoint):
    """Both describe how a sharded (FSDP) model is loaded from rank 0's copy: with a device map they cannot apply
    (tests/distributed/test_sequence_parallel.py loads an FSDP2 model from rank 0 without one)."""
    for kwargs, words in (({"broadcast_from_rank0": True}, "broadcast_from_rank0"),
                          ({"full_state_dict": False}, "full_state_dict=False")):
        with pytest.raises(NotSupportedYetError, match=words) as caught:
            load_checkpoint_and_dispatch(_empty(), checkpoint, device_map={"": "cpu"}, **kwargs)
        assert "\n" not in str(caught.value) and "load the checkpoint on every rank" in str(caught.value)
    assert load_checkpoint_and_dispatch(_empty(), checkpoint, device_map={"": "cpu"}, full_state_dict=True)
