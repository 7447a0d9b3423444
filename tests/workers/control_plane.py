"""Issue 22's CPU-visible fixes, in 2 real processes (gloo): `control_plane.py DIR`.

1. the control plane: helpers agree on every rank; the gloo group made beside a default group that serves no
   CPU tensor (forced here) is what FSDP's flags and `wait_for_everyone` use;
5. FULL_STATE_DICT load (FSDP1 and FSDP2): only rank 0 reads the model file; every rank ends with the saved weights;
6. `save_model` with `save_on_each_node` under FSDP2, with a fake second machine (rank 1 a local main process):
   both machines' `model.safetensors` hold the whole model.
Prints "control plane checks passed" once per rank. Run by tests/distributed/test_control.py.
"""

import os
import sys

import torch
import torch.distributed as dist

from fsdp_common import fresh_accelerator, full_params, make_model, max_diff, train_steps
from hasten.config.fsdp import FullyShardedDataParallelPlugin
from hasten.distributed import control
from hasten.state import PartialState
from hasten.utils import ProjectConfiguration

root = sys.argv[1]

# -- 1. the control plane -------------------------------------------------------------------------------------
acc = fresh_accelerator(cpu=True)
rank = acc.process_index
assert control.control_group() is None  # gloo serves CPU tensors: the default group is the control group
assert control.any_rank(rank == 1) and not control.any_rank(False)
assert control.max_across(10 + rank) == 11
assert control.all_gather_objects(("r", rank)) == [("r", 0), ("r", 1)]
assert control.broadcast_object(f"from {rank}", src=1) == "from 1"

seen_groups = []
real_all_reduce, real_barrier, real_serves_cpu = dist.all_reduce, dist.barrier, control._serves_cpu


def recording_all_reduce(tensor, *args, **kwargs):
    seen_groups.append(("all_reduce", kwargs.get("group"), tensor.device.type))
    return real_all_reduce(tensor, *args, **kwargs)


def recording_barrier(*args, **kwargs):
    seen_groups.append(("barrier", kwargs.get("group"), kwargs.get("device_ids")))
    return real_barrier(*args, **kwargs)


# As on a GPU: the default group serves no CPU tensor, so control collectives need a gloo group of their own.
control._serves_cpu = lambda backend: False
control.reset()
dist.all_reduce, dist.barrier = recording_all_reduce, recording_barrier
try:
    group = control.control_group()
    assert group is not None and group is control.control_group()  # made once
    assert dist.get_backend(group) == "gloo" and dist.get_world_size(group) == 2
    from hasten.backends.fsdp.backend import _on_any_rank

    assert _on_any_rank(rank == 0) and not _on_any_rank(False)
    acc.wait_for_everyone()
finally:
    dist.all_reduce, dist.barrier = real_all_reduce, real_barrier
    control._serves_cpu = real_serves_cpu
    control.reset()
assert seen_groups == [("all_reduce", group, "cpu")] * 2 + [("barrier", group, None)], seen_groups

# -- 5. FULL_STATE_DICT: only rank 0 reads the file --------------------------------------------------------------
real_load = torch.load
for version in (1, 2):
    plugin = FullyShardedDataParallelPlugin(fsdp_version=version, auto_wrap_policy="transformer_based_wrap",
                                            state_dict_type="FULL_STATE_DICT")
    acc = fresh_accelerator(fsdp_plugin=plugin, cpu=True)
    model = make_model(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, optimizer = acc.prepare(model, optimizer)
    train_steps(acc, model, optimizer, range(2))
    folder = os.path.join(root, f"full_v{version}")
    acc.save_state(folder)
    saved = full_params(acc, model)
    assert "pytorch_model_fsdp.bin" in os.listdir(folder)
    expected_next = train_steps(acc, model, optimizer, range(2, 4))

    plugin = FullyShardedDataParallelPlugin(fsdp_version=version, auto_wrap_policy="transformer_based_wrap",
                                            state_dict_type="FULL_STATE_DICT")
    acc = fresh_accelerator(fsdp_plugin=plugin, cpu=True)
    model = make_model(7)  # other weights: the load must bring the saved ones
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, optimizer = acc.prepare(model, optimizer)
    assert max_diff(full_params(acc, model), saved) > 1e-3
    reads = []

    def recording_load(path, *args, **kwargs):
        reads.append(os.path.basename(str(path)))
        return real_load(path, *args, **kwargs)

    torch.load = recording_load
    try:
        acc.load_state(folder)
    finally:
        torch.load = real_load
    model_reads = [name for name in reads if name.startswith("pytorch_model_fsdp")]
    assert model_reads == (["pytorch_model_fsdp.bin"] if rank == 0 else []), (version, rank, reads)
    assert max_diff(full_params(acc, model), saved) == 0.0, version
    resumed_next = train_steps(acc, model, optimizer, range(2, 4))
    assert max(abs(a - b) for a, b in zip(resumed_next, expected_next)) < 1e-6, (version, resumed_next, expected_next)

# -- 6. save_model with save_on_each_node: every machine writes the whole model --------------------------------
from safetensors.torch import load_file  # noqa: E402

plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
acc = fresh_accelerator(fsdp_plugin=plugin, cpu=True,
                        project_config=ProjectConfiguration(project_dir=root, save_on_each_node=True))
model = make_model(3)
model = acc.prepare(model)
whole = full_params(acc, model)
# a second machine: rank 1 is its machine's local main process (the process questions are PartialState's)
acc.state.local_process_index = PartialState().local_process_index = 0
assert acc.is_local_main_process
machine = os.path.join(root, f"machine{rank}")  # each machine's own disk
os.makedirs(machine, exist_ok=True)
with open(os.path.join(machine, "model-00001-of-00002.safetensors"), "w") as stale:
    stale.write("an old shard")
acc.save_model(model, machine, max_shard_size="1GB")
written = load_file(os.path.join(machine, "model.safetensors"))
assert set(written) == set(whole), (rank, sorted(written))
assert max_diff({k: v.float() for k, v in written.items()}, whole) == 0.0
assert sorted(os.listdir(machine)) == ["model.safetensors"], os.listdir(machine)

acc.wait_for_everyone()
print(f"rank {rank}: control plane checks passed", flush=True)
