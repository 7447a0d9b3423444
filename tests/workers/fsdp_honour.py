"""FSDP2 on 2 processes: what "accepted means honoured" fixed, one `ok <check>` line per check and rank.

Run by tests/backends/test_fsdp.py (one launch, many checks). `argv[1]`: a scratch folder shared by the ranks.
"""

import os
import shutil
import sys

import torch
from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig

from fsdp_common import DIM, fresh_accelerator, make_model, train_steps
from hasten.backends.fsdp.backend import _requires_gradient_sync
from hasten.config.fsdp import FullyShardedDataParallelPlugin
from hasten.core.errors import CheckpointError, ConfigError
from hasten.utils import load_fsdp_model, save_fsdp_model

root = sys.argv[1]


def ok(name):
    print(f"ok {name} rank {torch.distributed.get_rank()}", flush=True)


def setup(accumulation=1, **plugin_kwargs):
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap", **plugin_kwargs)
    acc = fresh_accelerator(fsdp_plugin=plugin, gradient_accumulation_steps=accumulation)
    model = make_model(0)
    model, optimizer = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    return acc, model, optimizer


def refused(error_type, call, *words):
    try:
        call()
    except error_type as error:
        assert all(w in str(error) for w in words), str(error)
        return
    raise AssertionError(f"{call} was not refused")


# trigger_sync_in_backward restores what was there: sync stays on after it, and off inside no_sync.
acc, model, optimizer = setup()
with acc.trigger_sync_in_backward(model):
    assert _requires_gradient_sync(model)
assert _requires_gradient_sync(model), "trigger_sync_in_backward left gradient sync off"
with acc.no_sync(model):
    with acc.trigger_sync_in_backward(model):
        assert _requires_gradient_sync(model)
    assert not _requires_gradient_sync(model)
assert _requires_gradient_sync(model)
train_steps(acc, model, optimizer, range(1))  # and gradients are still reduce-scattered afterwards
ok("trigger_sync")

# get_state_dict(unwrap=False) keeps a compile wrapper's prefix; unwrap=True gives the module's names.
compiled = torch.compile(model)  # compiles on first call only: nothing runs here
bare, wrapped = acc.get_state_dict(compiled, unwrap=True), acc.get_state_dict(compiled, unwrap=False)
if acc.is_main_process:
    assert "inp.weight" in bare and set(wrapped) == {"_orig_mod." + k for k in bare}, sorted(wrapped)[:3]
ok("unwrap")

# save_state keywords the FSDP backend has nowhere to pass are refused, before anything is written.
refused(ConfigError, lambda: acc.save_state(os.path.join(root, "kw"), client_state={}), "client_state", "drop them")
assert not os.path.exists(os.path.join(root, "kw"))
ok("save_kwargs")

# load_state(strict=False) loads into a model with a parameter the checkpoint lacks; strict=True refuses.
acc.save_state(os.path.join(root, "strict"))
acc.wait_for_everyone()
plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
acc2 = fresh_accelerator(fsdp_plugin=plugin)
bigger = make_model(1)
bigger.extra = torch.nn.Parameter(torch.ones(2, DIM))
bigger = acc2.prepare(bigger)
refused(BaseException, lambda: acc2.load_state(os.path.join(root, "strict")))  # DCP: missing key model.extra
acc2.load_state(os.path.join(root, "strict"), strict=False)
assert torch.equal(bigger.extra.full_tensor(), torch.ones(2, DIM))
refused(ConfigError, lambda: acc2.load_state(os.path.join(root, "strict"), assign=True), "assign", "drop them")
ok("load_strict")

# A missing RNG file on one rank: that rank takes the step counter the others saved.
acc, model, optimizer = setup(accumulation=4)
for step in range(3):
    with acc.accumulate(model):
        pass
acc.gradient_state._set_sync_gradients(True)  # saving mid-window is refused under FSDP (checked below)
acc.save_state(os.path.join(root, "rng"))
acc.wait_for_everyone()
if acc.is_main_process:
    # as on resuming with more processes than saved, in a folder Accelerate wrote (no hasten marker listing files)
    os.remove(os.path.join(root, "rng", "random_states_1.pkl"))
    os.remove(os.path.join(root, "rng", "hasten_checkpoint.json"))
acc.wait_for_everyone()
acc.step = 0
acc.load_state(os.path.join(root, "rng"))
assert acc.step == 3, acc.step
ok("rng_missing_step")

# Saving inside an accumulation window is refused (FSDP keeps the partial sum where no checkpoint reads it).
acc, model, optimizer = setup(accumulation=2)
with acc.accumulate(model):
    x = torch.randn(4, DIM)
    acc.backward(model(x).sum())
refused(CheckpointError, lambda: acc.save_state(os.path.join(root, "window")), "accumulation window")
ok("mid_window")

# The plugin's state_dict_config is read: rank0_only=False gives every rank the whole state.
acc, model, optimizer = setup(state_dict_type="FULL_STATE_DICT",
                              state_dict_config=FullStateDictConfig(offload_to_cpu=True, rank0_only=False),
                              optim_state_dict_config=FullOptimStateDictConfig(offload_to_cpu=True, rank0_only=False))
state = acc.get_state_dict(model)
assert "inp.weight" in state and state["inp.weight"].device.type == "cpu", sorted(state)
acc, model, optimizer = setup(state_dict_type="FULL_STATE_DICT")  # the defaults: the main process only
state = acc.get_state_dict(model)
assert bool(state) == acc.is_main_process
ok("state_dict_config")

# save_fsdp_model(use_dcp=False): one torch.save file per rank, read back by load_fsdp_model(use_dcp=False).
acc, model, optimizer = setup()
folder = os.path.join(root, "per_rank")
save_fsdp_model(acc.state.fsdp_plugin, accelerator=acc, model=model, output_dir=folder, model_index=0, use_dcp=False)
assert os.path.isfile(os.path.join(folder, f"pytorch_model_fsdp_0_rank{acc.process_index}.bin"))
assert not os.path.isdir(os.path.join(folder, "pytorch_model_fsdp_0"))
# model_index names the files (a second model beside the first); output_dir is where they go; the accelerator must
# be the run's Accelerator
second = os.path.join(root, "per_rank_second")
save_fsdp_model(acc.state.fsdp_plugin, accelerator=acc, model=model, output_dir=second, model_index=1, use_dcp=False)
acc.wait_for_everyone()
assert sorted(os.listdir(second)) == [f"pytorch_model_fsdp_1_rank{r}.bin" for r in range(2)], os.listdir(second)
try:
    save_fsdp_model(acc.state.fsdp_plugin, accelerator=None, model=model, output_dir=second, use_dcp=False)
    raise AssertionError("save_fsdp_model(accelerator=None) was accepted")
except TypeError as error:
    assert "accelerator must be the run's Accelerator" in str(error), error
before = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
with torch.no_grad():
    for p in model.parameters():
        p.zero_()
load_fsdp_model(acc.state.fsdp_plugin, acc, model, folder, use_dcp=False)
assert all(torch.equal(before[k], v.full_tensor()) for k, v in model.state_dict().items())
ok("use_dcp")

# FSDP1: limit_all_gathers reaches the wrapper; param_init_fn is what materialises a model built on "meta"
initialised = []


def init_on_cpu(module):
    initialised.append(type(module).__name__)
    module.to_empty(device="cpu", recurse=False)
    with torch.no_grad():
        for parameter in module.parameters(recurse=False):
            parameter.fill_(0.5)


plugin = FullyShardedDataParallelPlugin(fsdp_version=1, limit_all_gathers=False, param_init_fn=init_on_cpu)
acc = fresh_accelerator(fsdp_plugin=plugin)
with torch.device("meta"):
    meta_model = make_model(0)
wrapped = acc.prepare(meta_model)
assert wrapped.limit_all_gathers is False
assert initialised and all(p.device.type == "cpu" for p in wrapped.parameters()), initialised
from torch.distributed.fsdp import FullyShardedDataParallel  # noqa: E402

with FullyShardedDataParallel.summon_full_params(wrapped):  # the flat shards carry padding: read the whole weights
    assert all(torch.all(p == 0.5) for p in wrapped.parameters())
ok("fsdp1_init")
acc.wait_for_everyone()
if acc.is_main_process:
    shutil.rmtree(root, ignore_errors=True)
