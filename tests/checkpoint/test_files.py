"""checkpoint/files.py: Accelerate's checkpoint file names and how each kind is written and read, the one home that
`Backend`, `save_state`/`load_state` and Accelerate's standalone functions share."""

import os

import pytest
import torch

from hasten.checkpoint import files
from hasten.core.errors import CheckpointError


def test_names_follow_accelerates_layout():
    assert [files.model_name(i) for i in range(3)] == ["model.safetensors", "model_1.safetensors",
                                                       "model_2.safetensors"]
    assert files.model_name(1, safe_serialization=False) == "pytorch_model_1.bin"
    assert (files.optimizer_name(0), files.scheduler_name(2)) == ("optimizer.bin", "scheduler_2.bin")
    assert files.loader_name("sampler", 0) == "sampler.bin"
    assert files.loader_name("dl_state_dict", 1) == "dl_state_dict_1.bin"
    assert (files.rng_name(0), files.custom_name(3)) == ("random_states_0.pkl", "custom_checkpoint_3.pkl")


def test_ranks_and_custom_files_are_found_in_numeric_order(tmp_path):
    for name in ("random_states_10.pkl", "random_states_2.pkl", "random_states_x.pkl", "custom_checkpoint_10.pkl",
                 "custom_checkpoint_2.pkl", "custom_checkpoint_2.pkl.tmp"):
        (tmp_path / name).write_bytes(b"")
    assert files.ranks_with_rng(str(tmp_path)) == [2, 10]
    assert files.custom_files(str(tmp_path)) == [(2, "custom_checkpoint_2.pkl"), (10, "custom_checkpoint_10.pkl")]


def test_map_location_names_cpu_or_this_device_and_refuses_anything_else():
    asked = []
    device = lambda: asked.append(1) or torch.device("meta")  # noqa: E731
    assert files.resolve_map_location(None, device) == "cpu" and files.resolve_map_location("cpu", device) == "cpu"
    assert asked == []  # the device is looked up only for "on_device"
    assert files.resolve_map_location("on_device", device) == torch.device("meta")
    with pytest.raises(TypeError, match="map_location must be None, 'cpu' or 'on_device', got 'cuda'"):
        files.resolve_map_location("cuda", device)


def test_a_model_written_as_safetensors_or_bin_reads_back_and_a_missing_one_names_both_files(tmp_path):
    model = torch.nn.Linear(2, 2)
    for safe in (True, False):
        folder = tmp_path / str(safe)
        folder.mkdir()
        for name, write in files.model_files([model.state_dict()], safe) + files.optimizer_files(
                [torch.optim.SGD(model.parameters(), lr=0.5)]):
            write(os.path.join(folder, name))
        assert sorted(os.listdir(folder)) == sorted([files.model_name(0, safe), "optimizer.bin"])
        loaded = files.read_model(str(folder), 0, torch.nn.Linear(2, 2))
        assert torch.equal(loaded["weight"], model.weight.detach())
        assert files.read(str(folder), "optimizer.bin")["param_groups"][0]["lr"] == 0.5
        assert files.read_if_present(str(folder), "scheduler.bin") is None
    with pytest.raises(CheckpointError, match=r"model_1\.safetensors is missing \(nor is there pytorch_model_1\.bin\)"):
        files.read_model(str(tmp_path / "True"), 1, model)


def test_writers_stage_the_payload_when_made_and_write_later(tmp_path):
    staged = []
    scheduler = torch.optim.lr_scheduler.StepLR(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1.0), 1)
    name, write = files.scheduler_files([scheduler], stage=lambda obj, key: staged.append(key) or dict(obj))[0]
    assert staged == ["scheduler.bin"] and not os.listdir(tmp_path)
    write(str(tmp_path / name))
    assert files.read(str(tmp_path), name)["step_size"] == 1


def test_wrapper_prefixes_are_matched_to_the_model():
    model = torch.nn.Sequential(torch.nn.Linear(1, 1))
    saved = {"module.0.weight": torch.ones(1, 1), "_orig_mod.0.bias": torch.ones(1)}
    assert set(files.match_wrapper_prefixes(model, saved)) == {"0.weight", "0.bias"}
