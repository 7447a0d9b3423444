"""Sharded checkpoints across process counts: `save2 DIR` (2 processes), `load1 DIR` (1), `load2 DIR` (2).

save2 trains 3 steps, saves, and records the losses of the next 3; load1 resumes that checkpoint on one process
and must see the same losses, then saves again; load2 resumes that one on two processes. Run by tests/backends/test_fsdp.py.
"""

import importlib.util
import json
import os
import sys

import torch

from fsdp_common import fresh_accelerator, full_params, make_model, max_diff, train_steps
from hasten.config.fsdp import FullyShardedDataParallelPlugin

TOL = 1e-5  # fp32; only the order of additions differs between 1 and 2 processes
phase, root = sys.argv[1], sys.argv[2]
HAS_SAVE_STATE = importlib.util.find_spec("hasten.checkpointing") is not None


def setup(seed=0, **plugin_kwargs):
    if os.environ.get("HASTEN_USE_FSDP") == "true":
        # Launched with `hasten launch --use_fsdp --fsdp_*`: the Accelerator builds the plugin from FSDP_* variables.
        acc = fresh_accelerator()
        assert acc.state.fsdp_plugin.sources["fsdp_version"] == "environment variable FSDP_VERSION"
        assert acc.is_fsdp2 and acc.state.fsdp_plugin.transformer_cls_names_to_wrap == ["Block"]
    else:
        plugin = FullyShardedDataParallelPlugin(fsdp_version=plugin_kwargs.pop("fsdp_version", 2),
                                                auto_wrap_policy="transformer_based_wrap", **plugin_kwargs)
        acc = fresh_accelerator(fsdp_plugin=plugin)
    model = make_model(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, optimizer = acc.prepare(model, optimizer)
    return acc, model, optimizer


def save(acc, model, optimizer, folder):
    """Through save_state when the checkpoint module is there, else through the backend's own hook."""
    if HAS_SAVE_STATE:
        acc.save_state(folder)
    else:
        os.makedirs(folder, exist_ok=True)
        acc.wait_for_everyone()
        acc._backend.save_model_and_optimizer(folder, [model], [optimizer])
        acc.wait_for_everyone()


def load(acc, model, optimizer, folder):
    if HAS_SAVE_STATE:
        acc.load_state(folder)
    else:
        acc._backend.load_model_and_optimizer(folder, [model], [optimizer])


def record(name, value):
    with open(os.path.join(root, name), "w") as f:
        json.dump(value, f)


def recorded(name):
    with open(os.path.join(root, name)) as f:
        return json.load(f)


def close(a, b):
    return len(a) == len(b) and all(abs(x - y) <= TOL * max(1.0, abs(y)) for x, y in zip(a, b))


if phase == "save2":
    acc, model, optimizer = setup()
    train_steps(acc, model, optimizer, range(0, 3))
    folder = os.path.join(root, "ckpt_a")
    save(acc, model, optimizer, folder)
    for name in ("pytorch_model_fsdp_0", "optimizer_0"):
        files = os.listdir(os.path.join(folder, name))
        assert ".metadata" in files, files
        assert sum(f.endswith(".distcp") for f in files) == 2, ("one shard file per process", files)
    params = full_params(acc, model)
    if HAS_SAVE_STATE:  # save_model writes the whole model with its own names, from the main process
        acc.save_model(model, os.path.join(root, "saved_model"))
        if acc.is_main_process:
            from safetensors.torch import load_file

            assert max_diff(load_file(os.path.join(root, "saved_model", "model.safetensors")), params) == 0.0
    if acc.is_main_process:
        from safetensors.torch import save_file

        save_file(params, os.path.join(root, "params_a.safetensors"))  # for the merge-weights test
        record("losses_a.json", train_steps(acc, model, optimizer, range(3, 6)))
    else:
        train_steps(acc, model, optimizer, range(3, 6))

    # Loading into a differently initialised model restores the saved weights exactly (2 -> 2).
    acc, model, optimizer = setup(seed=1)
    load(acc, model, optimizer, folder)
    assert max_diff(full_params(acc, model), params) == 0.0

    # FULL_STATE_DICT: rank 0 writes whole files with Accelerate's names; loading gives the same weights.
    acc, model, optimizer = setup(state_dict_type="FULL_STATE_DICT")
    train_steps(acc, model, optimizer, range(0, 2))
    folder = os.path.join(root, "full")
    names = acc._backend.save_model_and_optimizer(folder if os.path.isdir(folder) else (os.makedirs(folder, exist_ok=True) or folder), [model], [optimizer])
    assert names == (["pytorch_model_fsdp.bin", "optimizer.bin"] if acc.is_main_process else []), names
    acc.wait_for_everyone()
    saved, next_losses = full_params(acc, model), train_steps(acc, model, optimizer, range(2, 4))
    acc, model, optimizer = setup(seed=1, state_dict_type="FULL_STATE_DICT")
    acc._backend.load_model_and_optimizer(folder, [model], [optimizer])
    assert max_diff(full_params(acc, model), saved) == 0.0
    assert close(train_steps(acc, model, optimizer, range(2, 4)), next_losses), "optimizer state not restored"

    # FSDP1 sharded checkpoints go through DCP as well.
    acc, model, optimizer = setup(fsdp_version=1)
    train_steps(acc, model, optimizer, range(0, 2))
    folder = os.path.join(root, "fsdp1")
    save(acc, model, optimizer, folder)
    saved, next_losses = full_params(acc, model), train_steps(acc, model, optimizer, range(2, 4))
    acc, model, optimizer = setup(seed=1, fsdp_version=1)
    load(acc, model, optimizer, folder)
    assert max_diff(full_params(acc, model), saved) == 0.0
    assert close(train_steps(acc, model, optimizer, range(2, 4)), next_losses)

elif phase == "load1":  # 2 -> 1
    acc, model, optimizer = setup(seed=1)
    assert acc.num_processes == 1
    load(acc, model, optimizer, os.path.join(root, "ckpt_a"))
    losses = train_steps(acc, model, optimizer, range(3, 6))
    assert close(losses, recorded("losses_a.json")), (losses, recorded("losses_a.json"))
    save(acc, model, optimizer, os.path.join(root, "ckpt_b"))
    record("losses_b.json", train_steps(acc, model, optimizer, range(6, 9)))

elif phase == "load2":  # 1 -> 2
    acc, model, optimizer = setup(seed=1)
    assert acc.num_processes == 2
    load(acc, model, optimizer, os.path.join(root, "ckpt_b"))
    losses = train_steps(acc, model, optimizer, range(6, 9))
    assert close(losses, recorded("losses_b.json")), (losses, recorded("losses_b.json"))

print(f"{phase}: rank {acc.process_index} ok (save_state used: {HAS_SAVE_STATE})")
