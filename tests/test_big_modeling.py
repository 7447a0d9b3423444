"""Big-model inference end to end: empty init, loading along device maps, dispatch, CPU/disk offload."""

from __future__ import annotations

import collections
import json
import os

import pytest
import torch
from torch import nn

from big_model_zoo import TinyLM, WithBuffers
from hasten import (
    Accelerator,
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    init_empty_weights,
    init_on_device,
    load_checkpoint_and_dispatch,
)
from hasten.core.errors import DeviceMapError, OffloadError
from hasten.hooks import remove_hook_from_submodules
from hasten.utils import load_checkpoint_in_model

IDS = torch.tensor([[1, 5, 9, 63, 0], [2, 2, 40, 7, 11]])


@pytest.fixture(scope="module")
def reference():
    torch.manual_seed(0)
    model = TinyLM().eval()
    with torch.no_grad():
        model.norm.bias.normal_()
    return model


def _save_sharded(model, folder, safe=True, shards=2):
    """A Hugging Face style sharded checkpoint (tied weights stored once)."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    state = {k: v for k, v in model.state_dict().items() if k != "head.weight"}
    names = list(state)
    step = -(-len(names) // shards)
    weight_map = {}
    for index in range(shards):
        part = names[index * step:(index + 1) * step]
        ext = "safetensors" if safe else "bin"
        stem = "model" if safe else "pytorch_model"
        file = f"{stem}-{index + 1:05d}-of-{shards:05d}.{ext}"
        tensors = {k: state[k].contiguous() for k in part}
        if safe:
            save_file(tensors, os.path.join(folder, file), metadata={"format": "pt"})
        else:
            torch.save(tensors, os.path.join(folder, file))
        weight_map.update({k: file for k in part})
    index_name = "model.safetensors.index.json" if safe else "pytorch_model.bin.index.json"
    with open(os.path.join(folder, index_name), "w") as handle:
        json.dump({"metadata": {}, "weight_map": weight_map}, handle)
    return folder


@pytest.fixture(scope="module")
def checkpoint(reference, tmp_path_factory):
    return _save_sharded(reference, str(tmp_path_factory.mktemp("ckpt")))


def _empty():
    with init_empty_weights():
        return TinyLM().eval()


# -- empty init -------------------------------------------------------------------------------------------------
def test_init_empty_weights_allocates_no_parameter_memory():
    with init_empty_weights():
        model = nn.Sequential(nn.Linear(10_000, 10_000), nn.BatchNorm1d(10_000))
    assert all(p.is_meta for p in model.parameters())
    assert model[0].weight.shape == (10_000, 10_000) and model[0].weight.requires_grad
    assert not model[1].running_mean.is_meta  # buffers stay real by default
    with init_empty_weights(include_buffers=True):
        model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
        plain = torch.ones(3)
    assert model[1].running_mean.is_meta and plain.is_meta
    assert torch.ones(1).device.type == "cpu"  # the context is gone afterwards


def test_include_buffers_default_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("ACCELERATE_INIT_INCLUDE_BUFFERS", "1")
    with init_empty_weights():
        norm = nn.BatchNorm1d(4)
    assert norm.running_mean.is_meta


def test_init_on_device_keeps_parameter_class_and_ties():
    class Marked(nn.Parameter):
        pass

    with init_on_device("meta"):
        layer = nn.Linear(2, 2)
        layer.extra = Marked(torch.ones(2), requires_grad=False)
        model = TinyLM()
    assert type(layer.extra) is Marked and layer.extra.is_meta and not layer.extra.requires_grad
    assert model.head.weight is model.embed.weight


# -- loading and dispatching ------------------------------------------------------------------------------------
MAPS = {
    "all on cpu": {"": "cpu"},
    "half on disk": {"embed": "cpu", "blocks.0": "cpu", "blocks.1": "disk", "blocks.2": "disk", "blocks.3": "cpu",
                     "norm": "disk", "head": "cpu"},
    "all on disk": {"": "disk"},
}


@pytest.mark.parametrize("name", list(MAPS))
def test_dispatched_outputs_equal_the_unsplit_model(reference, checkpoint, tmp_path, name):
    model = load_checkpoint_and_dispatch(_empty(), checkpoint, device_map=MAPS[name], offload_folder=str(tmp_path))
    expected = reference(IDS)
    assert torch.allclose(model(IDS), expected) and torch.allclose(model(IDS), expected)  # twice: re-offloaded
    assert model.hf_device_map == MAPS[name]
    if "disk" in MAPS[name].values():
        assert model.blocks[1].attn.weight.is_meta
        # A safetensors checkpoint is read in place: the offload folder holds only an index into its files.
        assert os.listdir(tmp_path) == ["index.json"]
        index = json.loads((tmp_path / "index.json").read_text())
        assert index["blocks.1.attn.weight"]["safetensors_file"].startswith(checkpoint)
    remove_hook_from_submodules(model)
    assert not hasattr(model, "_hf_hook") and model.forward.__func__ is TinyLM.forward


def test_auto_map_from_a_budget(reference, checkpoint, tmp_path):
    model = load_checkpoint_and_dispatch(_empty(), checkpoint, device_map="auto", max_memory={"cpu": 12000},
                                         no_split_module_classes=["Block"], offload_folder=str(tmp_path))
    assert model.hf_device_map == {"embed": "cpu", "head": "cpu", "blocks": "disk", "norm": "disk"}
    assert torch.allclose(model(IDS), reference(IDS))


def test_dtype_cast_and_offload_state_dict_with_bin_shards(reference, tmp_path, monkeypatch):
    import tempfile

    staged = []  # offload_state_dict=True stages the CPU weights of .bin shards in a temporary folder
    make = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *a, **k: staged.append(k.get("prefix")) or make(*a, **k))
    folder = _save_sharded(reference, str(tmp_path / "bin"), safe=False, shards=3)
    device_map = {"embed": "cpu", "blocks": "disk", "norm": "cpu", "head": "cpu"}
    model = load_checkpoint_and_dispatch(_empty(), folder, device_map=device_map, offload_folder=str(tmp_path / "off"),
                                         dtype="bfloat16", offload_state_dict=True)
    assert model.embed.weight.dtype == torch.bfloat16 and model.norm.weight.dtype == torch.bfloat16
    assert (tmp_path / "off" / "blocks.0.attn.weight.dat").is_file()  # .bin weights are written out
    output = model(IDS)
    assert output.dtype == torch.bfloat16
    assert torch.allclose(output.float(), reference(IDS), atol=0.3)
    staged.clear()
    plain = load_checkpoint_and_dispatch(_empty(), folder, device_map={"": "cpu"}, offload_state_dict=True)
    assert torch.allclose(plain(IDS), reference(IDS))
    assert staged == ["hasten-offload-"], "offload_state_dict=True did not stage the state dict on disk"


def test_safetensors_dtype_cast_when_offloaded(reference, checkpoint, tmp_path):
    model = load_checkpoint_and_dispatch(_empty(), checkpoint, device_map=MAPS["half on disk"],
                                         offload_folder=str(tmp_path), dtype=torch.float16)
    index = json.loads((tmp_path / "index.json").read_text())
    assert index["blocks.1.attn.weight"]["dtype"] == "float16"
    # execution on CPU in fp16 is slow but exact enough for a tiny model
    assert torch.allclose(model(IDS).float(), reference(IDS), atol=0.05)


def test_load_in_ram_maps_the_checkpoint_instead_of_copying(checkpoint, reference):
    from hasten.big_model.offload import mapped_safetensors

    model = _empty()
    load_checkpoint_in_model(model, checkpoint)
    assert torch.allclose(model(IDS), reference(IDS))
    shards = [mapped_safetensors(os.path.join(checkpoint, f)) for f in sorted(os.listdir(checkpoint))
              if f.endswith(".safetensors")]
    pointer = model.blocks[0].attn.weight.data_ptr()
    assert any(s._bytes.data_ptr() <= pointer < s._bytes.data_ptr() + s._bytes.numel() for s in shards)
    assert model.head.weight is model.embed.weight


def test_buffers_of_disk_modules_come_from_the_checkpoint(tmp_path):
    torch.manual_seed(0)
    source = WithBuffers().eval()
    source.batchnorm.running_mean += 3
    from safetensors.torch import save_file

    save_file(source.state_dict(), str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with init_empty_weights():
        model = WithBuffers().eval()
    device_map = {"scale": "cpu", "linear1": "cpu", "batchnorm": "disk", "linear2": "cpu", "offset": "cpu"}
    model = load_checkpoint_and_dispatch(model, str(tmp_path), device_map=device_map,
                                         offload_folder=str(tmp_path / "off"))
    x = torch.randn(4, 3)
    assert torch.allclose(model(x), source(x))


def test_dispatch_model_of_a_real_model_writes_disk_weights(reference, tmp_path):
    model = TinyLM().eval()
    model.load_state_dict(reference.state_dict())
    model = dispatch_model(model, MAPS["half on disk"], offload_dir=str(tmp_path))
    assert (tmp_path / "blocks.1.attn.weight.dat").is_file()
    assert torch.allclose(model(IDS), reference(IDS))
    with pytest.raises(RuntimeError, match="offloaded to cpu or disk"):
        model.to("cpu")


def test_cpu_offload_disk_offload_and_removing_hooks(reference, tmp_path):
    expected = reference(IDS)
    model = TinyLM().eval()
    model.load_state_dict(reference.state_dict())
    original = model.forward
    cpu_offload(model, execution_device="cpu")
    assert model.blocks[0].attn.weight.is_meta and torch.allclose(model(IDS), expected)
    remove_hook_from_submodules(model)
    assert model.forward == original and not model.blocks[0].attn.weight.is_meta
    assert torch.allclose(model(IDS), expected)

    disk_offload(model, str(tmp_path / "disk"), execution_device="cpu")
    assert (tmp_path / "disk" / "index.json").is_file() and torch.allclose(model(IDS), expected)
    remove_hook_from_submodules(model)
    assert model.forward == original and torch.allclose(model(IDS), expected)


def test_prefetch_chains_the_offloaded_blocks(reference, checkpoint, tmp_path):
    from hasten.hooks import AlignDevicesHook

    model = load_checkpoint_and_dispatch(_empty(), checkpoint, device_map={"": "disk"}, offload_folder=str(tmp_path),
                                         dtype=torch.float16)
    hooks = [m._hf_hook for m in model.modules() if isinstance(getattr(m, "_hf_hook", None), AlignDevicesHook)
             and m._hf_hook.offload]
    assert hooks and all(h.prefetch_next is not None for h in hooks)
    loader = hooks[0].weights_map.dataset
    seen = []
    original = loader._load
    loader._load = lambda key: seen.append(key) or original(key)
    for _ in range(2):
        assert torch.allclose(model(IDS).float(), reference(IDS), atol=0.05)
    loader._executor.submit(lambda: None).result()  # let the background thread finish
    # Each weight is read once per forward (prefetched or not), and the first block's once more: the last block
    # prefetches it for the next forward. Nothing is materialised twice.
    counts = collections.Counter(seen)
    assert counts == {key: 3 if key == "embed.weight" else 2 for key in loader.index}


def test_cpu_offload_with_hook_chains_a_pipeline(reference):
    first = TinyLM().eval()
    first.load_state_dict(reference.state_dict())
    torch.manual_seed(1)
    second = nn.Linear(64, 3)
    expected = second(reference(IDS))
    first, first_hook = cpu_offload_with_hook(first, execution_device="cpu")
    second, second_hook = cpu_offload_with_hook(second, execution_device="cpu", prev_module_hook=first_hook)
    assert torch.allclose(second(first(IDS)), expected)
    # Pretend the first model still sits on an accelerator after its forward (meta stands in for it here):
    # running the second model must offload the first.
    calls = []
    first.to("meta")
    first_hook.offload = lambda: calls.append("offloaded")
    second(torch.randn(1, 64))
    assert calls == ["offloaded"]
    second_hook.remove()
    assert not hasattr(second, "_hf_hook")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cpu_offload_with_hook_on_gpu(reference):
    first = TinyLM().eval()
    first.load_state_dict(reference.state_dict())
    second = nn.Linear(64, 3)
    first, first_hook = cpu_offload_with_hook(first, execution_device="cuda")
    second, second_hook = cpu_offload_with_hook(second, execution_device="cuda", prev_module_hook=first_hook)
    hidden = first(IDS)
    assert first.embed.weight.device.type == "cuda"
    second(hidden)
    assert first.embed.weight.device.type == "cpu" and second.weight.device.type == "cuda"
    second_hook.offload()
    assert second.weight.device.type == "cpu"


# -- bad input: one line that says what to change --------------------------------------------------------------
def test_device_map_naming_a_missing_module(checkpoint, monkeypatch):
    # as in Accelerate: a warning naming the key, and the model loads as the rest of the map says
    monkeypatch.delenv("HASTEN_STRICT", raising=False)
    with pytest.warns(UserWarning, match=r"do not match any submodules in the model: \['decoder'\]"):
        model = load_checkpoint_and_dispatch(_empty(), checkpoint, device_map={"": "cpu", "decoder": "cpu"})
    assert not any(p.is_meta for p in model.parameters())
    monkeypatch.setenv("HASTEN_STRICT", "1")  # hasten's strict setting: one line, before anything is loaded
    with pytest.raises(DeviceMapError, match=r"device_map keys \['decoder'\] name no module of the model"):
        load_checkpoint_and_dispatch(_empty(), checkpoint, device_map={"": "cpu", "decoder": "cpu"})
    monkeypatch.delenv("HASTEN_STRICT")
    with pytest.raises(DeviceMapError, match="not a known strategy.*'auto'"):
        load_checkpoint_and_dispatch(_empty(), checkpoint, device_map="fastest")


def test_budget_too_small_for_the_largest_layer(checkpoint):
    with pytest.raises(OffloadError, match=r"memory budget \{'cpu': 1000\} is too small.*largest layer \['blocks.0'\] "
                                           r"5504 bytes.*raise max_memory or pass offload_folder") as error:
        load_checkpoint_and_dispatch(_empty(), checkpoint, device_map="auto", max_memory={"cpu": 1000},
                                     no_split_module_classes=["Block"])
    assert "\n" not in str(error.value)


def test_offload_target_without_a_folder(checkpoint, reference):
    with pytest.raises(OffloadError, match=r"sends \['blocks.1', 'blocks.2', 'norm'\] to 'disk' but no offload_folder"):
        load_checkpoint_and_dispatch(_empty(), checkpoint, device_map=MAPS["half on disk"])
    model = TinyLM()
    model.load_state_dict(reference.state_dict())
    with pytest.raises(OffloadError, match="no offload_dir was given; pass offload_dir="):
        dispatch_model(model, {"": "disk"})
    with pytest.raises(OffloadError, match="needs an offload_dir"):
        disk_offload(model, None)


def test_checkpoint_that_does_not_match(tmp_path):
    from safetensors.torch import save_file

    save_file({"embed.weight": torch.zeros(3, 3)}, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"shape \(3, 3\), the model expects \(64, 16\)"):
        load_checkpoint_in_model(_empty(), str(tmp_path), device_map={"": "cpu"})


# -- Accelerator.prepare ---------------------------------------------------------------------------------------
def test_prepare_accepts_a_dispatched_model(reference, checkpoint, tmp_path):
    model = load_checkpoint_and_dispatch(_empty(), checkpoint, device_map=MAPS["half on disk"],
                                         offload_folder=str(tmp_path))
    hook = model._hf_hook
    prepared = Accelerator(cpu=True).prepare(model)
    assert prepared._hf_hook is hook and prepared.blocks[1].attn.weight.is_meta  # not moved, not wrapped
    with torch.no_grad():
        assert torch.allclose(prepared(IDS), reference(IDS))


# -- on a GPU (skipped without CUDA) ------------------------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_cpu_disk_map(reference, checkpoint, tmp_path):
    device_map = {"embed": 0, "blocks.0": 0, "blocks.1": "cpu", "blocks.2": "disk", "blocks.3": 0, "norm": "disk",
                  "head": 0}
    model = load_checkpoint_and_dispatch(_empty(), checkpoint, device_map=device_map, offload_folder=str(tmp_path))
    out = model(IDS)
    assert out.device.type == "cpu"  # outputs come back where the inputs were
    assert torch.allclose(out, reference(IDS), atol=1e-5)
    assert model.blocks[0].attn.weight.device.type == "cuda" and model.blocks[1].attn.weight.is_meta


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_auto_map_over_gpu_budget(reference, checkpoint, tmp_path):
    model = load_checkpoint_and_dispatch(_empty(), checkpoint, device_map="auto",
                                         max_memory={0: 12000, "cpu": 12000}, no_split_module_classes=["Block"],
                                         offload_folder=str(tmp_path))
    assert set(model.hf_device_map.values()) == {0, "cpu", "disk"}
    assert torch.allclose(model(IDS.cuda()).cpu(), reference(IDS), atol=1e-5)


# -- Accelerate's import paths ---------------------------------------------------------------------------------
PATHS = {
    "hasten": ["init_empty_weights", "init_on_device", "cpu_offload", "cpu_offload_with_hook", "disk_offload",
               "dispatch_model", "load_checkpoint_and_dispatch", "infer_auto_device_map", "load_checkpoint_in_model"],
    "hasten.big_modeling": ["init_empty_weights", "init_on_device", "cpu_offload", "cpu_offload_with_hook",
                            "disk_offload", "dispatch_model", "load_checkpoint_and_dispatch",
                            "attach_layerwise_casting_hooks"],
    "hasten.hooks": ["ModelHook", "SequentialHook", "add_hook_to_module", "remove_hook_from_module",
                     "remove_hook_from_submodules", "AlignDevicesHook", "CpuOffload", "UserCpuOffloadHook",
                     "LayerwiseCastingHook", "attach_execution_device_hook", "attach_align_device_hook",
                     "attach_align_device_hook_on_blocks"],
    "hasten.utils.modeling": ["infer_auto_device_map", "get_balanced_memory", "get_max_memory",
                              "compute_module_sizes", "get_max_layer_size", "set_module_tensor_to_device",
                              "named_module_tensors", "find_tied_parameters", "retie_parameters",
                              "check_device_map", "load_state_dict", "load_checkpoint_in_model", "dtype_byte_size",
                              "convert_file_size_to_int", "id_tensor_storage", "load_offloaded_weights",
                              "offload_weight", "save_offload_index", "calculate_maximum_sizes", "clean_device_map",
                              "align_module_device", "has_offloaded_params", "get_state_dict_offloaded_model"],
    "hasten.utils.offload": ["offload_state_dict", "offload_weight", "load_offloaded_weight", "save_offload_index",
                             "OffloadedWeightsLoader", "PrefixedDataset", "extract_submodules_state_dict"],
}


@pytest.mark.parametrize("module", sorted(PATHS))
def test_accelerate_import_paths(module):
    import importlib

    import hasten.utils

    loaded = importlib.import_module(module)
    for name in PATHS[module]:
        assert getattr(loaded, name) is not None, f"{module}.{name}"
        if module.startswith("hasten.utils.") or module == "hasten":
            if name not in ("init_empty_weights", "init_on_device", "cpu_offload", "cpu_offload_with_hook",
                            "disk_offload", "dispatch_model", "load_checkpoint_and_dispatch"):
                assert getattr(hasten.utils, name) is getattr(loaded, name), f"hasten.utils.{name}"


def test_state_dict_of_an_offloaded_model(reference, checkpoint, tmp_path):
    from hasten.utils import get_state_dict_offloaded_model

    model = load_checkpoint_and_dispatch(_empty(), checkpoint, device_map=MAPS["half on disk"],
                                         offload_folder=str(tmp_path))
    state = get_state_dict_offloaded_model(model)
    expected = reference.state_dict()
    assert set(state) == set(expected)
    assert all(torch.equal(state[k], expected[k]) for k in expected)
    assert model.blocks[1].attn.weight.is_meta  # put back after reading


class _Scaled(nn.Module):
    """A root with a weight of its own beside offloadable children."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.full((3,), 2.0))
        self.first = nn.Linear(3, 3)
        self.norm = nn.BatchNorm1d(3)

    def forward(self, x):
        return self.norm(self.first(x)) * self.scale


@pytest.mark.parametrize("safe", [True, False])
def test_save_model_writes_the_offloaded_weights_not_meta_placeholders(tmp_path, safe):
    torch.manual_seed(0)
    reference = _Scaled().eval()
    with torch.no_grad():
        reference.norm.running_mean.normal_()
    inputs = torch.randn(4, 3)
    expected = reference(inputs)
    accelerator = Accelerator(cpu=True)
    accelerator.save_model(reference, tmp_path / "full", safe_serialization=safe)
    with init_empty_weights():
        offloaded = _Scaled().eval()
    load_checkpoint_and_dispatch(offloaded, str(tmp_path / "full"), device_map={"scale": "cpu", "first": "cpu", "norm": "disk"},
                                 offload_folder=str(tmp_path / "offload"))
    assert offloaded.norm.weight.is_meta
    state = accelerator.get_state_dict(offloaded)
    assert set(state) == set(reference.state_dict())
    assert all(torch.equal(state[k], v) for k, v in reference.state_dict().items())
    assert offloaded.norm.weight.is_meta  # read back from the offload, then put back
    accelerator.save_model(offloaded, tmp_path / "again", safe_serialization=safe)
    with init_empty_weights():
        reloaded = _Scaled().eval()
    load_checkpoint_and_dispatch(reloaded, str(tmp_path / "again"))
    assert torch.allclose(reloaded(inputs), expected)


def test_load_checkpoint_in_model_reads_any_index_json_and_a_bare_weight_map(reference, tmp_path):
    """Older sharded checkpoints name their index freely and store the bare {name: file} map."""
    state = reference.state_dict()
    names = sorted(state)
    weight_map = {name: ("part-a.bin" if i % 2 else "part-b.bin") for i, name in enumerate(names)}
    for file in ("part-a.bin", "part-b.bin"):
        torch.save({k: state[k] for k in names if weight_map[k] == file}, tmp_path / file)
    (tmp_path / "weights.index.json").write_text(json.dumps(weight_map))
    for source in (tmp_path / "weights.index.json", tmp_path):
        model = TinyLM().eval()
        load_checkpoint_in_model(model, str(source), strict=True)
        assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    (tmp_path / "other.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(RuntimeError, match="several weights indexes"):
        load_checkpoint_in_model(TinyLM(), str(tmp_path))
    (tmp_path / "other.index.json").write_text(json.dumps({"weight_map": [1, 2]}))
    with pytest.raises(RuntimeError, match="not a valid weights index"):
        load_checkpoint_in_model(TinyLM(), str(tmp_path / "other.index.json"))


def test_sequence_parallelism_refuses_linear_attention_layers():
    from types import SimpleNamespace

    from hasten.big_modeling import _refuse_recurrent_layers_under_sequence_parallelism as refuse

    def model(layer_types):
        config = SimpleNamespace(layer_types=layer_types)
        config.get_text_config = lambda: config
        return SimpleNamespace(config=config)

    with pytest.raises(ValueError, match=r"\['linear_attention'\]"):
        refuse(model(["full_attention", "linear_attention", "linear_attention"]))
    refuse(model(["full_attention", "sliding_attention"]))
    refuse(SimpleNamespace(config=SimpleNamespace(get_text_config=lambda: SimpleNamespace())))
    refuse(torch.nn.Linear(2, 2))  # no config at all
