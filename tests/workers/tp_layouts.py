"""Tensor parallelism on 2 processes, launched by tests/backends/test_tensor_parallel.py with a config file whose
`parallelism_config:` block says tp_size 2 (Accelerate accepts that block and ignores it).

- TP=2 on a plain PyTorch transformer (tp_common.TinyGPT: no tp_plan attribute) matches one process (TOL);
- parameters are DTensors split on `tp`; the rank properties equal what the mesh says; both ranks read the same
  batches from a prepared loader; gather_for_metrics counts each sample once; clip_grad_norm_ is the global norm;
- save_state under TP=2, continue 2 steps; the same checkpoint loaded under FSDP=2 continues identically (the one-
  process load runs after this script, in tp_resume_one.py); save_model writes whole weights;
- TP composed with FSDP2 on 2-D meshes (1,2) and (2,1), and replicas of a TP model (HSDP with one shard), match too;
- a user plan, activation checkpointing and torch.compile over the split model; the automatic plan's refusals.
Usage: tp_layouts.py <folder>
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from tp_common import (
    GLOBAL_BATCH, HEADS, TinyGPT, fresh_accelerator, loss_of, make_model, max_diff, reference, sgd, tokens,
    whole,
)
from hasten import ParallelismConfig
from hasten.core.enums import DistributedType
from hasten.core.errors import ConfigError
from hasten.data.ranks import data_ranks
from hasten.parallelism_config import TorchTensorParallelConfig
from hasten.utils import get_model_tp_size, model_has_dtensor

TOL = 1e-5  # fp32; measured differences are ~6e-8 (only the order of additions differs from one process)
FIRST, MORE = range(3), range(3, 5)
folder = sys.argv[1]
rank = dist.get_rank() if dist.is_initialized() else int(os.environ["RANK"])


def train(acc, model, opt, steps, max_norm=None):
    """Each process trains on its data-parallel share of the global batch of every step; returns the losses."""
    size, index = data_ranks(acc.torch_device_mesh)
    per = GLOBAL_BATCH // size
    losses, norms = [], []
    for step in steps:
        loss = loss_of(model, tokens(step)[index * per:(index + 1) * per])
        acc.backward(loss)
        if max_norm is not None:
            norms.append(float(acc.clip_grad_norm_(model.parameters(), max_norm)))
        opt.step()
        opt.zero_grad()
        losses.append(acc.reduce(loss.detach(), reduction="mean").item())
    return losses, norms


want, want_losses = reference(FIRST)
want_more, _ = reference(range(5))  # the checkpoint carries the momentum

# -- TP=2 from the config file's parallelism_config block -----------------------------------------------------------
assert os.environ.get("PARALLELISM_CONFIG_TP_SIZE") == "2", "the config file's block did not reach the process"
acc = fresh_accelerator(project_dir=folder)
config = acc.parallelism_config
assert config is not None and config.tp_size == 2 and acc.distributed_type == DistributedType.MULTI_CPU
mesh = acc.torch_device_mesh
assert mesh.mesh_dim_names == ("tp",), mesh.mesh_dim_names
assert acc.tensor_parallel_rank == mesh.get_local_rank("tp") == rank
assert acc.data_parallel_rank == acc.data_parallel_shard_rank == acc.context_parallel_rank == 0
assert data_ranks(mesh) == (1, 0)
model = make_model()
opt = sgd(model.parameters())  # built before prepare: it must update the split parameters
loader = torch.utils.data.DataLoader(torch.arange(10), batch_size=2)
model, opt, loader = acc.prepare(model, opt, loader)
assert model_has_dtensor(model) and get_model_tp_size(model) == 2
q = model.blocks[0].attn.q_proj.weight
assert isinstance(q, DTensor) and q.device_mesh.mesh_dim_names == ("tp",) and q.placements[0].is_shard(0)
assert q.to_local().shape == (8, 16) and model.blocks[0].attn.n_heads == HEADS // 2  # head count adjusted
assert model.blocks[0].mlp.fc2.weight.placements[0].is_shard(1)  # rowwise
assert model.embed.weight.placements[0].is_shard(0) and model.head.weight.placements[0].is_shard(0)
assert not isinstance(model.norm.weight, DTensor)  # a norm stays whole
params = {id(p) for p in model.parameters()}
assert all(id(p) in params for g in opt.optimizer.param_groups for p in g["params"]), "optimizer not re-pointed"
seen = [batch.tolist() for batch in loader]
both = [None, None]
dist.all_gather_object(both, seen)
assert both[0] == both[1] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]], both  # one TP group reads the same batches
gathered = [acc.gather_for_metrics(batch) for batch in loader]
assert torch.cat(gathered).tolist() == list(range(10)), gathered  # each sample once, not once per TP rank
assert acc.gather_for_metrics(["a"], use_gather_object=True) == ["a"]
losses, norms = train(acc, model, opt, FIRST, max_norm=1e9)
got = whole(model.state_dict())
assert max_diff(got, want) < TOL, max_diff(got, want)
assert max(abs(a - b) for a, b in zip(losses, want_losses)) < TOL, (losses, want_losses)
reference_model = make_model()
loss_of(reference_model, tokens(0)).backward()
want_norm = torch.nn.utils.get_total_norm([p.grad for p in reference_model.parameters()]).item()
assert abs(norms[0] - want_norm) < 1e-4, (norms[0], want_norm)

# -- checkpoints: save under TP=2, continue; save_model writes whole weights ------------------------------------------
saved = acc.save_state(os.path.join(folder, "tp_ckpt"))
train(acc, model, opt, MORE)
after_tp = whole(model.state_dict())
assert max_diff(after_tp, want_more) < TOL, max_diff(after_tp, want_more)
acc.save_model(model, os.path.join(folder, "tp_model"))
if rank == 0:
    from safetensors.torch import load_file

    full = load_file(os.path.join(folder, "tp_model", "model.safetensors"))
    assert max_diff(full, want_more) < TOL and full["blocks.0.mlp.fc1.weight"].shape == (64, 16)
acc.wait_for_everyone()
del os.environ["PARALLELISM_CONFIG_TP_SIZE"]

# -- the same checkpoint under FSDP=2 continues identically ----------------------------------------------------------
acc = fresh_accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2))
assert acc.distributed_type == DistributedType.FSDP and acc.data_parallel_shard_rank == rank
model = make_model(seed=1)  # other weights: the checkpoint must replace them
opt = sgd(model.parameters())
model, opt = acc.prepare(model, opt)
acc.load_state(saved)
train(acc, model, opt, MORE)
after_fsdp = whole(model.state_dict())
assert max_diff(after_fsdp, after_tp) < TOL, max_diff(after_fsdp, after_tp)

# -- a user plan (module patterns -> styles) -----------------------------------------------------------------------
plan = {"blocks.*.mlp.fc1": "colwise", "blocks.*.mlp.fc2": "rowwise", "head": "colwise_rep"}
acc = fresh_accelerator(parallelism_config=ParallelismConfig(
    tp_size=2, tp_handler=TorchTensorParallelConfig(tp_plan=plan)))
model = make_model()
opt = sgd(model.parameters())
model, opt = acc.prepare(model, opt)
assert isinstance(model.blocks[1].mlp.fc1.weight, DTensor) and not isinstance(model.blocks[1].attn.q_proj.weight, DTensor)
assert model.blocks[0].attn.n_heads == HEADS  # attention left whole: its head count too
train(acc, model, opt, FIRST)
assert max_diff(whole(model.state_dict()), want) < TOL


# -- activation checkpointing (the FSDP plugin's) composes with TP: same weights ------------------------------------
from hasten import FullyShardedDataParallelPlugin  # noqa: E402

plugin = FullyShardedDataParallelPlugin(fsdp_version=2, activation_checkpointing=True,
                                        auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"])
acc = fresh_accelerator(parallelism_config=ParallelismConfig(tp_size=2), fsdp_plugin=plugin)
model = make_model()
opt = sgd(model.parameters())
model, opt = acc.prepare(model, opt)
assert acc._backend.name == "tensor_parallel" and isinstance(model.blocks[0].mlp.fc1.weight, DTensor)
train(acc, model, opt, FIRST)
assert max_diff(whole(model.state_dict()), want) < TOL


# -- torch.compile (aot_eager: no C++ toolchain needed) over the split model: same weights -----------------------------
acc = fresh_accelerator(parallelism_config=ParallelismConfig(tp_size=2), dynamo_backend="aot_eager")
model = make_model()
opt = sgd(model.parameters())
model, opt = acc.prepare(model, opt)
assert type(model).__name__ == "OptimizedModule", type(model)
train(acc, model, opt, FIRST)
assert max_diff(whole(acc.unwrap_model(model, keep_torch_compile=False).state_dict()), want) < TOL


# -- what the automatic plan refuses: one line naming the module ------------------------------------------------------
def refused(model, *expected):
    acc = fresh_accelerator(parallelism_config=ParallelismConfig(tp_size=2))
    try:
        acc.prepare(model)
    except ConfigError as error:
        assert "\n" not in str(error) and all(e in str(error) for e in expected), str(error)
        return
    raise AssertionError(f"{type(model).__name__} was accepted")


class WithMHA(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(16, 4)


class OddHeads(TinyGPT):
    def __init__(self):
        super().__init__()
        self.blocks[1].attn.n_heads = 3


refused(WithMHA(), "attn is an nn.MultiheadAttention")
refused(OddHeads(), "blocks.1.attn.n_heads=3", "tp_size=2 does not divide")
refused(torch.nn.Sequential(torch.nn.Linear(16, 1)), "found nothing to split in Sequential")

# -- TP composed with FSDP2 on 2-D meshes of 2 processes (the layouts of 4 run in tp_grid.py) ----------------------------
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

from hasten.distributed.tp_plan import apply_tensor_parallel  # noqa: E402

for shape, names in (((1, 2), ("dp_shard", "tp")), ((2, 1), ("dp_shard", "tp")),
                     ((2, 1, 1), ("dp_replicate", "dp_shard", "tp"))):
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    model = make_model()
    apply_tensor_parallel(model, mesh["tp"])
    data_mesh = mesh[names[:-1]] if len(names) > 2 else mesh[names[0]]
    for block in model.blocks:
        fully_shard(block, mesh=data_mesh)
    fully_shard(model, mesh=data_mesh)
    opt = sgd(model.parameters())
    size, index = data_ranks(mesh)
    per = GLOBAL_BATCH // size
    for step in FIRST:
        loss_of(model, tokens(step)[index * per:(index + 1) * per]).backward()
        opt.step()
        opt.zero_grad()
    assert max_diff(whole(model.state_dict()), want) < TOL, (shape, max_diff(whole(model.state_dict()), want))

print(f"rank {rank}: tensor parallel checks passed")
