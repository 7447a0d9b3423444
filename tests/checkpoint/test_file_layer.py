"""The fast checkpoint readers: what they return equals torch.load / safetensors, for every kind of file hasten
and Accelerate write, and damage is still named."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from hasten import Accelerator
from hasten.checkpoint.storage import fast_io
from hasten.core.errors import CheckpointError, UnsafeCheckpointError
from hasten.state import AcceleratorState, GradientState


@pytest.fixture(autouse=True)
def _fresh_state():
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture(params=["one request", "tiny requests"])
def request_size(request, monkeypatch):
    """Run each read once as usual and once split into many small requests (a tensor over several requests,
    several tensors and zip headers in one, buffers-per-call limit reached)."""
    if request.param == "tiny requests":
        monkeypatch.setattr(fast_io, "REQUEST_BYTES", 96)
        monkeypatch.setattr(fast_io, "_IOV_MAX", 3)
    return request.param


def assert_same(expected, actual, where="root"):
    if isinstance(expected, torch.Tensor):
        assert type(actual) is torch.Tensor, where
        assert (actual.dtype, actual.shape, actual.stride(), actual.storage_offset()) == (
            expected.dtype, expected.shape, expected.stride(), expected.storage_offset()), where
        assert actual.requires_grad == expected.requires_grad, where
        assert torch.equal(actual, expected), where
    elif isinstance(expected, dict):
        assert type(actual) is type(expected) and list(actual) == list(expected), where
        for key in expected:
            assert_same(expected[key], actual[key], f"{where}.{key}")
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected), where
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_same(e, a, f"{where}[{i}]")
    elif isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray) and np.array_equal(expected, actual), where
    else:
        assert type(actual) is type(expected) and actual == expected, where


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))


def _train(model, optimizer, steps):
    torch.manual_seed(1)
    for _ in range(steps):
        model(torch.randn(4, 5)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def _int_step_adam(model):
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    _train(model, optimizer, 2)
    for state in optimizer.state.values():  # state dicts of older torch versions held `step` as a Python int
        state["step"] = int(state["step"])
    return optimizer


OPTIMIZERS = {
    "SGD with momentum": lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, nesterov=True),
    "Adam": lambda m: torch.optim.Adam(m.parameters(), lr=0.01),
    "AdamW amsgrad": lambda m: torch.optim.AdamW(m.parameters(), lr=0.01, amsgrad=True, weight_decay=0.1),
    "AdamW param groups": lambda m: torch.optim.AdamW([
        {"params": m[0].parameters(), "lr": 0.01, "betas": (0.8, 0.9)},
        {"params": m[2].parameters(), "lr": 0.001, "weight_decay": 0.0, "name": "head"},
    ]),
    "Adagrad": lambda m: torch.optim.Adagrad(m.parameters(), lr=0.1),
    "Rprop": lambda m: torch.optim.Rprop(m.parameters(), lr=0.01),
    "LBFGS-like ints": lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
}


@pytest.mark.parametrize("name", [*OPTIMIZERS, "Adam with int step"])
@pytest.mark.parametrize("steps", [0, 3])
def test_optimizer_state_round_trip(tmp_path, name, steps, request_size):
    model = _model()
    if name == "Adam with int step":
        optimizer = _int_step_adam(model)
    else:
        optimizer = OPTIMIZERS[name](model)
        _train(model, optimizer, steps)
    saved = optimizer.state_dict()
    if name == "LBFGS-like ints":
        saved["state"][0] = {"func_evals": 7, "n_iter": 3, "d": torch.randn(3, 3), "flag": True, "old": [1.5, None]}
    path = tmp_path / "optimizer.bin"
    torch.save(saved, path)

    assert fast_io._plan_torch_file(str(path), {}) is not None  # the fast path reads it, not the fallback
    loaded = fast_io.load_object(str(path))
    assert_same(torch.load(path, weights_only=True), loaded)
    if name in ("LBFGS-like ints", "Adam with int step"):  # not states today's torch optimizers step from
        return
    # The loaded state continues training exactly like the optimizer that wrote it.
    twin = _model()
    twin.load_state_dict(model.state_dict())
    twin_optimizer = OPTIMIZERS[name](twin)
    twin_optimizer.load_state_dict(loaded)
    _train(model, optimizer, 1)
    _train(twin, twin_optimizer, 1)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters()))


def test_optimizer_state_is_read_into_the_optimizers_own_tensors(tmp_path, request_size):
    from hasten.checkpoint import files

    model = _model()
    optimizer = OPTIMIZERS["AdamW param groups"](model)
    _train(model, optimizer, 3)
    path = tmp_path / "optimizer.bin"
    torch.save(optimizer.state_dict(), path)
    expected = torch.load(path, weights_only=True)
    _train(model, optimizer, 2)  # the live state moves on
    live = optimizer.state_dict()["state"]
    pointers = {(i, k): v.data_ptr() for i, state in live.items() for k, v in state.items()}
    loaded = fast_io.load_object(str(path), into=files.optimizer_twin(optimizer))
    assert_same(expected, loaded)
    # every state tensor was read into the memory the optimizer holds: no fresh memory
    assert {(i, k): v.data_ptr() for i, state in loaded["state"].items() for k, v in state.items()} == pointers
    assert torch.equal(live[0]["exp_avg"], expected["state"][0]["exp_avg"])
    optimizer.load_state_dict(loaded)
    assert optimizer.state_dict()["state"][0]["exp_avg"].data_ptr() == pointers[(0, "exp_avg")]
    # a saved state of another shape (other parameter groups) is read into fresh memory
    other = torch.optim.AdamW(_model().parameters(), lr=0.01)
    other_live = {k: v.data_ptr() for k, v in other.state_dict()["state"].get(0, {}).items()}
    fresh = fast_io.load_object(str(path), into=files.optimizer_twin(other))
    assert_same(expected, fresh) and not other_live


def test_a_failed_model_load_leaves_the_optimizer_untouched(tmp_path):
    accelerator = Accelerator(cpu=True)
    plain = _model()
    model, optimizer = accelerator.prepare(plain, OPTIMIZERS["Adam"](plain))
    _train(model, optimizer, 2)
    accelerator.save_state(str(tmp_path / "ckpt"))
    _train(model, optimizer, 1)
    before = {k: v.clone() for k, v in optimizer.state_dict()["state"][0].items()}
    bigger = torch.nn.Sequential(torch.nn.Linear(5, 9), torch.nn.ReLU(), torch.nn.Linear(9, 3))
    accelerator._models[0] = bigger  # the checkpoint's weights do not fit this model
    with pytest.raises(CheckpointError):
        accelerator.load_state(str(tmp_path / "ckpt"))
    assert all(torch.equal(v, before[k]) for k, v in optimizer.state_dict()["state"][0].items())


def test_torch_files_keep_views_dtypes_and_numpy(tmp_path, request_size):
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    payload = {
        "view": base[1:, ::2], "base": base, "transposed": base.t(), "empty": torch.zeros(0, 3),
        "scalar": torch.tensor(3, dtype=torch.int16), "bf16": torch.randn(5, dtype=torch.bfloat16),
        "bool": torch.tensor([True, False, True]), "grad": torch.ones(2, requires_grad=True),
        "numpy": np.random.get_state()[1], "nested": [(1, "a", None), {"x": 2.5, 3: torch.float16}],
        "random_state": random.getstate(), "size": torch.Size([2, 3]),
    }
    payload["again"] = payload["base"]
    path = tmp_path / "mixed.bin"
    torch.save(payload, path)
    assert fast_io._plan_torch_file(str(path), {}) is not None
    loaded = fast_io.load_object(str(path))
    assert_same(torch.load(path, weights_only=False), loaded)
    # Views still share memory, and the same tensor twice is one object, as with torch.load.
    assert loaded["view"].untyped_storage().data_ptr() == loaded["base"].untyped_storage().data_ptr()
    assert loaded["again"] is loaded["base"]
    loaded["base"][1, 0] = -1.0
    assert loaded["view"][0, 0] == -1.0


def test_files_the_fast_path_does_not_rebuild_fall_back_to_torch_load(tmp_path):
    legacy = tmp_path / "legacy.bin"  # torch.save's pre-1.6 format: not a zip
    torch.save({"w": torch.randn(3)}, legacy, _use_new_zipfile_serialization=False)
    assert fast_io._plan_torch_file(str(legacy), {}) is None
    assert_same(torch.load(legacy, weights_only=True), fast_io.load_object(str(legacy)))

    sparse = tmp_path / "sparse.bin"
    torch.save({"s": torch.eye(3).to_sparse()}, sparse)
    assert fast_io._plan_torch_file(str(sparse), {}) is None
    assert torch.equal(fast_io.load_object(str(sparse))["s"].to_dense(), torch.eye(3))

    parameter = tmp_path / "parameter.bin"
    torch.save({"p": torch.nn.Parameter(torch.ones(2))}, parameter)
    loaded = fast_io.load_object(str(parameter))["p"]
    assert type(loaded) is torch.nn.Parameter and torch.equal(loaded, torch.ones(2))

    # Options the fast path does not reproduce go to torch.load as given.
    mmapped = fast_io.load_object(str(sparse.with_name("legacy.bin")), {"weights_only": True})
    assert torch.equal(mmapped["w"], torch.load(legacy, weights_only=True)["w"])


class _Exploit:
    def __reduce__(self):
        return (os.system, (f"touch {os.environ['HASTEN_EXPLOIT_MARK']}",))


def test_unsafe_and_damaged_torch_files_are_named(tmp_path, monkeypatch):
    mark = tmp_path / "pwned"
    monkeypatch.setenv("HASTEN_EXPLOIT_MARK", str(mark))
    path = tmp_path / "optimizer.bin"
    torch.save({"state": {0: {"exp_avg": torch.ones(3)}}, "evil": _Exploit()}, path)
    with pytest.raises(UnsafeCheckpointError, match="optimizer.bin"):
        fast_io.load_object(str(path))
    with pytest.raises(UnsafeCheckpointError):
        fast_io.prefetch([str(path)])  # skipped there; the load in its turn raises
        fast_io.load_object(str(path))
    assert not mark.exists()

    torch.save({"w": torch.randn(1000)}, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="optimizer.bin is corrupt"):
        fast_io.load_object(str(path))


SAFETENSORS = {
    "f32": torch.randn(3, 4), "f64": torch.randn(2, dtype=torch.float64), "bf16": torch.randn(7, dtype=torch.bfloat16),
    "f16": torch.randn(1, 3, dtype=torch.float16), "i64": torch.arange(5), "i8": torch.tensor([-1, 2], dtype=torch.int8),
    "u8": torch.tensor([255], dtype=torch.uint8), "bool": torch.tensor([True, False]), "scalar": torch.tensor(2.5),
    "empty": torch.zeros(0, 4), "f8": torch.randn(6).to(torch.float8_e4m3fn),
}


def test_safetensors_round_trip(tmp_path, request_size):
    path = tmp_path / "model.safetensors"
    save_file(SAFETENSORS, path)
    loaded = fast_io.load_tensors(str(path))
    reference = load_file(path)
    assert set(loaded) == set(reference)
    for name, tensor in reference.items():
        assert_same(tensor, loaded[name], name)
    # Each tensor owns its memory, so what is loaded can be saved again (safetensors refuses shared memory).
    save_file(loaded, tmp_path / "again.safetensors")


def test_safetensors_written_from_memory_equal_save_file_byte_for_byte(tmp_path, request_size):
    tensors = {**SAFETENSORS, "transposed": torch.randn(4, 3).t(), "u16": torch.tensor([1, 2, 60000], dtype=torch.uint16),
               "c64": torch.randn(2, dtype=torch.complex64), "a_name": torch.ones(2, 2, dtype=torch.int32),
               "gewicht_ä.日本": torch.ones(1)}
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    fast_io.save_tensors(tensors, str(ours))
    save_file({k: v.contiguous() for k, v in tensors.items()}, theirs, metadata={"format": "pt"})
    assert ours.read_bytes() == theirs.read_bytes()
    # A dtype the writer does not know goes through safetensors itself.
    fast_io.save_tensors({"fnuz": torch.ones(2).to(torch.float8_e5m2fnuz)}, str(ours))
    assert torch.equal(load_file(ours)["fnuz"].float(), torch.ones(2))


def test_safetensors_read_into_the_model_itself(tmp_path, request_size):
    model = _model()
    path = tmp_path / "model.safetensors"
    save_file({k: v + 1 for k, v in model.state_dict().items()}, path)
    targets = model.state_dict()
    pointers = {k: v.data_ptr() for k, v in targets.items()}
    targets["2.bias"] = torch.zeros(5)  # a shape the file does not have: read into new memory instead
    loaded = fast_io.load_tensors(str(path), into=targets)
    assert loaded["0.weight"] is targets["0.weight"] and loaded["0.weight"].data_ptr() == pointers["0.weight"]
    assert loaded["2.bias"].data_ptr() != pointers["2.bias"] and loaded["2.bias"].shape == (3,)
    reference = load_file(path)
    assert all(torch.equal(reference[k], loaded[k]) for k in reference)
    assert torch.equal(model[0].weight, reference["0.weight"])  # the parameter itself holds the file's values


def test_tensors_mapped_from_a_file_are_not_read_into(tmp_path):
    """A model whose parameters are safetensors' mapping of a file (`load_file` + `assign=True`): writing there
    would first copy every page from that file, so the checkpoint goes to fresh memory instead."""
    model = _model()
    mapped_path, path = tmp_path / "mapped.safetensors", tmp_path / "model.safetensors"
    save_file(model.state_dict(), mapped_path)
    model.load_state_dict(load_file(mapped_path), assign=True)
    assert fast_io._Used().file_backed(model[0].weight.data_ptr())  # the check sees the mapping
    assert not fast_io._Used().file_backed(torch.randn(1000).data_ptr())
    save_file({k: v + 1 for k, v in model.state_dict().items()}, path)
    targets = model.state_dict()
    before = {k: v.clone() for k, v in targets.items()}
    loaded = fast_io.load_tensors(str(path), into=targets)
    assert all(loaded[k].data_ptr() != targets[k].data_ptr() for k in targets)  # fresh memory
    assert all(torch.equal(loaded[k], before[k] + 1) for k in targets)
    assert all(torch.equal(targets[k], before[k]) for k in targets)  # the mapping was not written


def test_damaged_safetensors_are_named(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"a": torch.randn(100), "b": torch.randn(10)}, path)
    data = path.read_bytes()
    for damaged in (data[:-4], data + b"\0" * 8, data[:6], b"\xff" * 8 + data[8:]):
        path.write_bytes(damaged)
        with pytest.raises(CheckpointError, match="model.safetensors is corrupt"):
            fast_io.load_tensors(str(path))
    os.remove(path)
    with pytest.raises(CheckpointError, match="model.safetensors is missing"):
        fast_io.load_tensors(str(path))


def test_prefetched_reads_are_taken_over_and_released(tmp_path):
    first, second = tmp_path / "model.safetensors", tmp_path / "optimizer.bin"
    save_file({"w": torch.randn(64)}, first)
    torch.save({"state": {0: {"m": torch.randn(64)}}}, second)
    queued = fast_io.prefetch([str(first), str(second), str(tmp_path / "absent.bin")])
    assert len(queued.pending) == 2 and len(fast_io._prefetched) == 2
    assert torch.equal(fast_io.load_tensors(str(first))["w"], load_file(first)["w"])
    assert_same(torch.load(second, weights_only=True), fast_io.load_object(str(second)))
    assert len(fast_io._prefetched) == 0

    # A file replaced after it was queued is read again, not served stale.
    queued = fast_io.prefetch([str(second)])
    torch.save({"state": {0: {"m": torch.zeros(64)}}}, second)
    assert torch.equal(fast_io.load_object(str(second))["state"][0]["m"], torch.zeros(64))
    # Queued reads nobody took are released with the handle.
    queued = fast_io.prefetch([str(first)])
    assert len(fast_io._prefetched) == 1
    del queued
    assert len(fast_io._prefetched) == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_reads_work_in_a_forked_child(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.arange(10.0)}, path)
    fast_io.load_tensors(str(path))  # the parent's reader threads exist now
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        try:
            ok = torch.equal(fast_io.load_tensors(str(path))["w"], torch.arange(10.0))
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def _checkpoint_of_accelerate_layout(folder: Path, model, optimizer, scheduler, safe: bool):
    """The files Accelerate's save_state writes, built here with torch.save/safetensors (no marker)."""
    folder.mkdir()
    if safe:
        save_file(model.state_dict(), folder / "model.safetensors", metadata={"format": "pt"})
    else:
        torch.save(model.state_dict(), folder / "pytorch_model.bin")
    torch.save(optimizer.state_dict(), folder / "optimizer.bin")
    torch.save(scheduler.state_dict(), folder / "scheduler.bin")
    torch.save({"step": 0, "random_state": random.getstate(), "numpy_random_seed": np.random.get_state(),
                "torch_manual_seed": torch.get_rng_state()}, folder / "random_states_0.pkl")


@pytest.mark.parametrize("safe", [True, False])
def test_accelerate_and_older_hasten_checkpoints_load(tmp_path, safe):
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    _train(model, optimizer, 2)
    scheduler.step()
    folder = tmp_path / "accelerate"
    _checkpoint_of_accelerate_layout(folder, model, optimizer, scheduler, safe)
    expected_model = {k: v.clone() for k, v in model.state_dict().items()}
    expected_optimizer = optimizer.state_dict()

    accelerator = Accelerator(cpu=True)
    fresh = _model()
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=0.01)
    fresh_scheduler = torch.optim.lr_scheduler.StepLR(fresh_optimizer, step_size=1, gamma=0.5)
    fresh, fresh_optimizer, fresh_scheduler = accelerator.prepare(fresh, fresh_optimizer, fresh_scheduler)
    accelerator.load_state(str(folder))
    assert all(torch.equal(expected_model[k], v) for k, v in fresh.state_dict().items())
    assert_same(expected_optimizer["state"], fresh_optimizer.optimizer.state_dict()["state"])
    assert fresh_scheduler.scheduler.last_epoch == 1

    # A checkpoint hasten wrote (same files plus its marker) loads the same way, into the model's own memory.
    pointers = [p.data_ptr() for p in fresh.parameters()]
    saved = accelerator.save_state(str(tmp_path / "hasten"))
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    accelerator.load_state(saved)
    assert all(torch.equal(expected_model[k], v) for k, v in fresh.state_dict().items())
    assert [p.data_ptr() for p in fresh.parameters()] == pointers
