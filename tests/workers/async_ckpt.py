"""Asynchronous save_state in real processes: `async_ckpt.py MODE ROOT PHASE`, MODE `plain` (1 process or
DDP) or `fsdp` (FSDP2, sharded through DCP's async_save), PHASE `main` then `resume`. Run by
tests/checkpoint/test_async_save.py, which launches each phase and checks what it left on disk.

main:   an async and a sync save of the same state; training goes on while the async one is held open by the
        test-only gate (HASTEN_TEST_ASYNC_WRITE_GATE) and its marker appears only after the gate opens; both
        checkpoints load bit-identically and resume to the same weights; rotation with total_limit under async
        saves (in FSDP mode one of them FULL_STATE_DICT); a background write error raised at the next
        save_state on every rank; weights changed in place before the writer copied them (refused, or, in FSDP
        mode, staged at the call); then the writer thread of every process SIGKILLs it in the middle of a file (checkpoint_io's crash
        points) while training goes on.
resume: load_state() picks the newest complete checkpoint (the killed one is not); then one async save that
        nobody waits for: interpreter exit must finish and commit it.
"""

import glob
import json
import os
import sys

import torch

from hasten import Accelerator, ProjectConfiguration
from hasten.checkpoint import async_save as background
from hasten.checkpoint.storage import durable
from hasten.checkpoint.storage.marker import MARKER_NAME
from hasten.checkpoint.storage.folder import list_checkpoints, newest_checkpoint
from hasten.core.errors import CheckpointError

mode, root, phase = sys.argv[1], sys.argv[2], sys.argv[3]
ckpts = os.path.join(root, "checkpoints")


class Progress:
    """A registered object; `broken` makes its state unpicklable, so only the background write fails."""

    def __init__(self):
        self.value, self.broken = 0, False

    def state_dict(self):
        return {"value": self.value, "history": torch.arange(4) * self.value,
                **({"fn": lambda: None} if self.broken else {})}

    def load_state_dict(self, state):
        self.value = state["value"]


def setup():
    kwargs = {}
    if mode == "fsdp":
        from hasten.config.fsdp import FullyShardedDataParallelPlugin

        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                                               state_dict_type="SHARDED_STATE_DICT")
    acc = Accelerator(project_config=ProjectConfiguration(project_dir=root, automatic_checkpoint_naming=True,
                                                          total_limit=2), **kwargs)
    sys.path.insert(0, os.path.dirname(__file__))
    from fsdp_common import make_model

    model = make_model(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + step))
    model, optimizer, scheduler = acc.prepare(model, optimizer, scheduler)
    progress = Progress()
    acc.register_for_checkpointing(progress)
    return acc, model, optimizer, scheduler, progress


def train(acc, model, optimizer, scheduler, progress, steps):
    from fsdp_common import batch

    for step in steps:
        x, y = batch(step, acc.process_index, acc.num_processes)
        acc.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        progress.value += 1


def weights(acc, model) -> dict:
    """Whole weights and nothing else, on every process (a collective under FSDP)."""
    state = acc.get_state_dict(model)
    if mode == "fsdp":
        box = [state if acc.is_main_process else None]
        torch.distributed.broadcast_object_list(box, src=0)
        state = box[0]
    return {k: v.detach().clone() for k, v in state.items()}


def same(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def marker(path):
    return os.path.isfile(os.path.join(path, MARKER_NAME))


def say(*words):
    # One write per line: under PYTHONUNBUFFERED print() writes each piece on its own, and the two ranks' pieces
    # then interleave in the shared pipe (seen in CI: "[rank 0] [rank 1]ASYNC-... ASYNC-...: 3").
    line = " ".join([f"[rank {int(os.environ.get('RANK', 0))}]", *map(str, words)]) + "\n"
    sys.stdout.write(line)
    sys.stdout.flush()


def main_phase():
    acc, model, optimizer, scheduler, progress = setup()
    objects = (acc, model, optimizer, scheduler, progress)
    train(*objects, range(0, 2))
    at_save = weights(acc, model)

    # 1. The same state saved synchronously and asynchronously; the async one is held open by the test gate.
    gate = os.path.join(root, "gate")
    os.environ[background.GATE_ENV] = gate
    sync_path = acc.save_state()
    async_path = acc.save_state(async_save=True)
    assert os.path.basename(async_path) == "checkpoint_1" and acc.project_configuration.iteration == 2
    for step in range(2, 5):  # training goes on while the checkpoint is being written
        train(*objects, range(step, step + 1))
        assert not marker(async_path) and background.in_flight(), "committed while the gate was shut"
    after = weights(acc, model)
    acc.wait_for_everyone()
    if acc.is_main_process:
        open(gate, "w").close()
    acc.wait_for_checkpoint()
    del os.environ[background.GATE_ENV]
    assert marker(async_path) and newest_checkpoint(ckpts) == async_path, os.listdir(ckpts)
    say("ASYNC-WHILE-TRAINING steps done before commit:", progress.value - 2)

    # 2. Both checkpoints hold the state of the save call (not the 3 steps after it) and resume identically.
    for path in (async_path, sync_path):
        acc.load_state(path)
        assert same(weights(acc, model), at_save), f"{path}: weights differ from the state at save time"
        assert progress.value == 2 and acc.step == 0
        train(*objects, range(2, 5))
        assert same(weights(acc, model), after), f"{path}: resumed training differs"
    if mode == "plain" and acc.is_main_process:
        with open(os.path.join(sync_path, "model.safetensors"), "rb") as a, open(os.path.join(async_path, "model.safetensors"), "rb") as b:
            assert a.read() == b.read(), "async model.safetensors differs from the synchronous one"
    say("ASYNC-EQUALS-SYNC")

    # 3. Rotation: three async saves in a row (each waits for the one before); total_limit=2 keeps the newest two.
    snapshots = {}
    for i in range(3):
        full = mode == "fsdp" and i == 1
        if full:
            acc.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
        path = acc.save_state(async_save=True)
        snapshots[path] = (weights(acc, model), progress.value)
        if full:
            acc.state.fsdp_plugin.set_state_dict_type("SHARDED_STATE_DICT")
        train(*objects, range(5 + i, 6 + i))
    acc.wait_for_checkpoint()
    kept = list_checkpoints(ckpts)
    assert [os.path.basename(p) for p in kept] == ["checkpoint_3", "checkpoint_4"], kept
    assert all(marker(p) for p in kept) and not glob.glob(os.path.join(ckpts, ".*"))
    for path in kept:
        acc.load_state(path)
        assert same(weights(acc, model), snapshots[path][0]) and progress.value == snapshots[path][1], path
    if mode == "fsdp":
        assert os.path.isfile(os.path.join(kept[0], "pytorch_model_fsdp.bin")), os.listdir(kept[0])
        assert os.path.isdir(os.path.join(kept[1], "pytorch_model_fsdp_0")), os.listdir(kept[1])
    say("ASYNC-ROTATION")

    # 4. A background write that fails (rank 0's custom object file cannot be pickled) is raised by the next
    # call on every rank; nothing of it is committed or left behind.
    progress.broken = True
    failed = acc.save_state(async_save=True)
    progress.broken = False
    train(*objects, range(8, 9))
    try:
        acc.save_state(async_save=True)
    except CheckpointError as error:
        assert "rank 0" in str(error), error
        say("ASYNC-ERROR", str(error).splitlines()[0][:200])
    else:
        raise AssertionError("the failed background write was not raised")
    assert not os.path.exists(failed) and acc.project_configuration.iteration == 6
    acc.wait_for_everyone()
    assert not glob.glob(os.path.join(ckpts, ".*")), os.listdir(ckpts)
    acc.wait_for_checkpoint()  # raised once, not again

    # 4b. Every weight changed in place (outside optimizer.step()) between the call and the writer's copy, held
    # back by the stage gate. Plain/DDP: the writer copies the parameters, sees the change and fails the save on
    # rank 0 (raised on every rank); the newest checkpoint stays the one before. FSDP (DCP copies the shards in
    # the call): the save holds the weights of the call.
    before = newest_checkpoint(ckpts)
    at_call = weights(acc, model)
    stage_gate = os.path.join(root, "stage-gate")
    os.environ[background.STAGE_GATE_ENV] = stage_gate
    changed = acc.save_state(async_save=True)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2)
    acc.wait_for_everyone()
    if acc.is_main_process:
        open(stage_gate, "w").close()
    outcome = None
    try:
        acc.wait_for_checkpoint()
    except CheckpointError as error:
        outcome = str(error)
    del os.environ[background.STAGE_GATE_ENV]
    if mode == "plain":
        assert outcome and "rank 0" in outcome and "was changed in place" in outcome and "\n" not in outcome, outcome
        assert newest_checkpoint(ckpts) == before and not os.path.exists(changed), os.listdir(ckpts)
        with torch.no_grad():
            for p in model.parameters():
                p.div_(2)
        say("ASYNC-INPLACE refused:", outcome[outcome.index("rank 0"):][:120])
    else:
        assert outcome is None and newest_checkpoint(ckpts) == changed, outcome
        acc.load_state(changed)
        say("ASYNC-INPLACE staged at the call")
    assert same(weights(acc, model), at_call)
    acc.wait_for_everyone()
    assert not glob.glob(os.path.join(ckpts, ".*")), os.listdir(ckpts)

    # 5. The checkpoint the kill below must leave as the newest complete one.
    keep = acc.save_state(async_save=True)
    expected = weights(acc, model)
    acc.wait_for_checkpoint()
    if acc.is_main_process:
        torch.save({"weights": expected, "progress": progress.value, "path": keep}, os.path.join(root, "expected.pt"))
    train(*objects, range(9, 10))
    # The writer thread kills the process (SIGKILL) at its 2nd crash point: after its first file, which it cuts
    # to half its size first (checkpoint_io's test hook), while the main thread keeps training.
    durable._crash_counter[0] = 0
    os.environ[durable.CRASH_ENV] = "2"
    say(f"KILL expected during the write of checkpoint_{acc.project_configuration.iteration}")
    acc.save_state(async_save=True)
    for step in range(10, 10**6):
        train(*objects, range(step % 16, step % 16 + 1))
    raise AssertionError("the writer thread did not reach its crash point")


def resume_phase():
    acc, model, optimizer, scheduler, progress = setup()
    expected = torch.load(os.path.join(root, "expected.pt"), weights_only=True)
    assert glob.glob(os.path.join(ckpts, ".checkpoint_8.hasten-tmp-*")) and not os.path.exists(
        os.path.join(ckpts, "checkpoint_8")), os.listdir(ckpts)
    acc.load_state()  # the newest complete checkpoint
    assert same(weights(acc, model), expected["weights"]) and progress.value == expected["progress"]
    assert acc.project_configuration.iteration == 8
    say("RESUMED", expected["path"])
    train(acc, model, optimizer, scheduler, progress, range(9, 10))
    last = acc.save_state(async_save=True)  # nobody waits: interpreter exit must commit it
    final = weights(acc, model)
    if acc.is_main_process:
        with open(os.path.join(root, "unwaited.json"), "w") as handle:
            json.dump({"path": last, "progress": progress.value}, handle)
        torch.save(final, os.path.join(root, "unwaited.pt"))
    say("EXITING with a save in flight")


main_phase() if phase == "main" else resume_phase()
