"""Accelerate's standalone checkpoint functions: save/load_accelerator_state, save/load_custom_state, and
clean_state_dict_for_safetensors."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from hasten.checkpointing import load_accelerator_state, load_custom_state, save_accelerator_state, save_custom_state
from hasten.core.errors import UnsafeCheckpointError
from hasten.utils import clean_state_dict_for_safetensors
from hasten.utils.constants import RNG_STATE_NAME, SAFE_WEIGHTS_NAME, SCALER_NAME, WEIGHTS_NAME


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.head = torch.nn.Linear(3, 5, bias=False)
        self.head.weight = self.embed.weight


def _trained(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model(torch.randn(8, 3)).pow(2).mean().backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


def _draws():
    return random.random(), float(np.random.rand()), torch.rand(1).item()


def test_round_trip_restores_every_piece(tmp_path):
    model, optimizer, scheduler = _trained(0)
    scaler = torch.amp.GradScaler("cpu", init_scale=512.0)
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    out = save_accelerator_state(tmp_path, [model.state_dict()], [optimizer], [scheduler], [], 0, step=7, scaler=scaler)
    assert out == str(tmp_path)
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {SAFE_WEIGHTS_NAME, "optimizer.bin", "scheduler.bin", SCALER_NAME, f"{RNG_STATE_NAME}_0.pkl"}
    expected_draws = _draws()

    fresh, fresh_opt, fresh_sched = _trained(42)
    fresh_opt.load_state_dict(torch.optim.AdamW(fresh.parameters(), lr=0.1).state_dict())  # empty state
    fresh_scaler = torch.amp.GradScaler("cpu")
    overrides = load_accelerator_state(tmp_path, [fresh], [fresh_opt], [fresh_sched], [], 0, scaler=fresh_scaler)
    assert overrides == {"step": 7}
    assert _draws() == expected_draws  # RNG states came back
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values()):
        assert torch.equal(a, b)
    assert fresh_opt.state_dict()["state"][0]["step"] == optimizer.state_dict()["state"][0]["step"]
    assert torch.equal(fresh_opt.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])
    assert fresh_sched.state_dict() == scheduler.state_dict()
    assert fresh_scaler.get_scale() == 512.0


def test_several_models_pickled_weights_and_tied_tensors(tmp_path):
    tied, plain = Tied(), torch.nn.Linear(2, 2)
    save_accelerator_state(tmp_path, [plain.state_dict(), tied.state_dict()], [], [], [], 0, step=0,
                           safe_serialization=True)
    assert {"model.safetensors", "model_1.safetensors"} <= {p.name for p in tmp_path.iterdir()}
    new_tied, new_plain = Tied(), torch.nn.Linear(2, 2)
    load_accelerator_state(tmp_path, [new_plain, new_tied], [], [], [], 0)
    assert torch.equal(new_tied.embed.weight, tied.embed.weight)
    assert new_tied.head.weight is new_tied.embed.weight  # still tied

    bin_dir = tmp_path / "bin"
    save_accelerator_state(bin_dir, [plain.state_dict()], [], [], [], 0, step=0, safe_serialization=False)
    assert (bin_dir / WEIGHTS_NAME).is_file()
    other = torch.nn.Linear(2, 2)
    load_accelerator_state(bin_dir, [other], [], [], [], 0)
    assert torch.equal(other.weight, plain.weight)


def test_loader_positions_and_strict_loading(tmp_path):
    class Loader:
        def __init__(self, position):
            self.position = position

        def state_dict(self):
            return {"position": self.position}

        def load_state_dict(self, state):
            self.position = state["position"]

    class StatefulLoader(Loader):
        use_stateful_dataloader = True

    model = torch.nn.Linear(2, 2)
    save_accelerator_state(tmp_path, [model.state_dict()], [], [], [Loader(5), StatefulLoader(7)], 0, step=0)
    assert {"sampler.bin", "dl_state_dict_1.bin"} <= {p.name for p in tmp_path.iterdir()}
    loader, stateful = Loader(0), StatefulLoader(0)
    load_accelerator_state(tmp_path, [torch.nn.Linear(2, 2)], [], [], [loader, stateful], 0)
    # As in Accelerate: only a use_stateful_dataloader loader is moved (scripts skip a plain one's batches by hand).
    assert (loader.position, stateful.position) == (0, 7)
    with pytest.raises(RuntimeError, match="Missing key"):  # extra kwargs reach load_state_dict
        load_accelerator_state(tmp_path, [torch.nn.Sequential(torch.nn.Linear(2, 2))], [], [], [], 0, strict=True)
    load_accelerator_state(tmp_path, [torch.nn.Sequential(torch.nn.Linear(2, 2))], [], [], [], 0, strict=False)


def test_bad_map_location_and_missing_rng_file(tmp_path):
    model = torch.nn.Linear(2, 2)
    with pytest.raises(TypeError, match="map_location"):
        load_accelerator_state(tmp_path, [model], [], [], [], 0, map_location="cuda:7")
    save_accelerator_state(tmp_path, [model.state_dict()], [], [], [], 0, step=3)
    assert load_accelerator_state(tmp_path, [model], [], [], [], 1) == {}  # no random_states_1.pkl: allowed
    (tmp_path / f"{RNG_STATE_NAME}_0.pkl").write_bytes(b"garbage")
    with pytest.raises(RuntimeError, match="corrupt"):  # Accelerate logs and carries on here
        load_accelerator_state(tmp_path, [model], [], [], [], 0)


def test_accelerator_load_state_reads_what_the_function_wrote(tmp_path):
    from hasten import Accelerator

    model, optimizer, scheduler = _trained(0)
    save_accelerator_state(tmp_path, [model.state_dict()], [optimizer], [scheduler], [], 0, step=4)
    accelerator = Accelerator(cpu=True)
    fresh, fresh_opt, fresh_sched = _trained(9)
    fresh, fresh_opt, fresh_sched = accelerator.prepare(fresh, fresh_opt, fresh_sched)
    accelerator.load_state(tmp_path)
    assert torch.equal(accelerator.unwrap_model(fresh)[0].weight, model[0].weight)
    assert accelerator.step == 4


class Counter:
    def __init__(self, count=0):
        self.count = count

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


def test_custom_state_round_trip_and_safe_loading(tmp_path, monkeypatch):
    monkeypatch.delenv("HASTEN_STRICT", raising=False)
    save_custom_state(Counter(11), tmp_path, index=2)
    assert (tmp_path / "custom_checkpoint_2.pkl").is_file()
    restored = Counter()
    load_custom_state(restored, tmp_path, index=2)
    assert restored.count == 11

    class Holder(Counter):
        def state_dict(self):
            return {"count": Counter(self.count)}  # an arbitrary object: unpickling it could run code

    save_custom_state(Holder(3), tmp_path, index=0)
    # As in Accelerate: the custom file is unpickled (weights_only=False), so any Python object loads.
    restored = Counter()
    load_custom_state(restored, tmp_path, index=0)
    assert isinstance(restored.count, Counter) and restored.count.count == 3
    with pytest.raises(UnsafeCheckpointError, match="weights_only"):  # an explicit weights_only wins
        load_custom_state(Counter(), tmp_path, index=0, load_kwargs={"weights_only": True})
    # hasten's strict setting keeps the safe read; load_kwargs opts in.
    monkeypatch.setenv("HASTEN_STRICT", "1")
    with pytest.raises(UnsafeCheckpointError, match="weights_only"):
        load_custom_state(Counter(), tmp_path, index=0)
    load_custom_state(restored, tmp_path, index=0, load_kwargs={"weights_only": False})
    assert restored.count.count == 3
    load_custom_state(restored, tmp_path, index=2)  # plain values load safely under strict too
    assert restored.count == 11


def test_clean_state_dict_for_safetensors(caplog):
    tied = Tied()
    state = {**tied.state_dict(), "view": torch.arange(6.0).reshape(2, 3).t(), "note": 3}
    with caplog.at_level("WARNING"):
        cleaned = clean_state_dict_for_safetensors(state)
    # one logged record, in Accelerate's words (code captures the record, not a Python warning)
    assert [r.getMessage() for r in caplog.records if "Removed shared tensor" in r.getMessage()] == [
        r.getMessage() for r in caplog.records]
    assert len(caplog.records) == 1 and "head.weight" in caplog.records[0].getMessage()
    assert "embed.weight" in cleaned and "head.weight" not in cleaned
    assert cleaned["view"].is_contiguous() and torch.equal(cleaned["view"], state["view"])
    assert cleaned["note"] == 3
    assert "head.weight" in state  # the input is left alone


def test_accelerator_save_with_safetensors_keeps_one_name_of_tied_weights(tmp_path, caplog):
    from safetensors.torch import load_file

    from hasten import Accelerator

    tied = Tied()
    path = tmp_path / "model.safetensors"
    with caplog.at_level("WARNING"):
        Accelerator(cpu=True).save(tied.state_dict(), path, safe_serialization=True)
    assert [r.getMessage() for r in caplog.records if "Removed shared tensor" in r.getMessage()] == [
        r.getMessage() for r in caplog.records] and "head.weight" in caplog.text  # one record, as Accelerate logs
    saved = load_file(path)
    assert set(saved) == {"embed.weight"} and torch.equal(saved["embed.weight"], tied.embed.weight)
    fresh = Tied()
    fresh.load_state_dict(saved, strict=False)  # the tie fills head.weight
    assert torch.equal(fresh.head.weight, tied.embed.weight)
