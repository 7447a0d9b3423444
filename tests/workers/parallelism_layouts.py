"""ParallelismConfig layouts on 2 processes: dp_shard_size=2 trains with FSDP2, dp_replicate_size=2 (and all sizes 1)
with DDP, rank properties read the mesh, and what cannot run is refused in one line (tensor parallelism: tp_layouts.py). Launched by
tests/test_parallelism_config.py with `--parallelism_config_dp_shard_size 2`, so the first layout comes from the flag."""

import os

import torch
from torch.distributed.tensor import DTensor

from fsdp_common import batch, fresh_accelerator, full_params, make_model, max_diff, train_steps
from hasten import ParallelismConfig
from hasten.core.enums import DistributedType
from hasten.core.errors import ConfigError, NotBuiltError

STEPS = range(3)
TOL = 1e-5  # fp32: only the order of additions differs from the one-process reference


def sgd(params):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def reference():
    model = make_model()
    opt = sgd(model.parameters())
    for step in STEPS:
        x, y = batch(step, 0, 1)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train(acc):
    model = make_model()
    opt = sgd(model.parameters())  # built before prepare: it must follow the sharded parameters
    model, opt = acc.prepare(model, opt)
    train_steps(acc, model, opt, STEPS)
    return model


def one_line_error(kind, expected, **kwargs):
    try:
        fresh_accelerator(parallelism_config=ParallelismConfig(**kwargs))
    except kind as error:
        text = str(error)
        assert "\n" not in text and all(e in text for e in expected), text
        return
    raise AssertionError(f"ParallelismConfig({kwargs}) was accepted on 2 processes")


want = reference()

# -- from the launch flag: dp_shard_size=2 -> FSDP2 over the mesh's dp_shard dimension -------------------------
assert os.environ.get("PARALLELISM_CONFIG_DP_SHARD_SIZE") == "2", "the launcher did not pass the flag on"
acc = fresh_accelerator()
assert acc.parallelism_config is not None and acc.parallelism_config.dp_shard_size == 2
assert acc.distributed_type == DistributedType.FSDP and acc.is_fsdp2 and acc.is_composable_parallelism_enabled
mesh = acc.torch_device_mesh
assert mesh.mesh_dim_names == ("dp_shard",), mesh.mesh_dim_names
assert acc.data_parallel_shard_rank == mesh.get_local_rank("dp_shard") == acc.process_index
assert acc.data_parallel_rank == 0 and acc.tensor_parallel_rank == 0 and acc.context_parallel_rank == 0
config = acc.parallelism_config
assert config.submesh("dp_shard_cp").size() == 2 and config.submesh("dp").mesh_dim_names == ("dp",)
model = train(acc)
params = list(model.parameters())
assert all(isinstance(p, DTensor) for p in params), [type(p).__name__ for p in params]
assert all(p.placements[0].is_shard(0) and p.device_mesh.mesh_dim_names == ("dp_shard_cp",) for p in params)
assert all(p.to_local().shape[0] == p.shape[0] // 2 for p in params if p.shape[0] % 2 == 0), "not sharded in half"
assert max_diff(full_params(acc, model), want) < TOL

# the environment's dp_shard_size=2 and a dp_replicate_size=2 in code multiply to 4 on 2 processes
one_line_error(ConfigError, ("multiply to 4", "2 process"), dp_replicate_size=2)
del os.environ["PARALLELISM_CONFIG_DP_SHARD_SIZE"]

# -- dp_replicate_size=2 -> DDP; all sizes 1 on 2 processes -> replicate over both, as Accelerate does ------------
for config in (ParallelismConfig(dp_replicate_size=2), ParallelismConfig()):
    acc = fresh_accelerator(parallelism_config=config)
    assert acc.distributed_type == DistributedType.MULTI_CPU and not acc.is_fsdp2, acc.distributed_type
    assert config.dp_replicate_size == 2 and config.total_size == 2
    mesh = acc.torch_device_mesh
    assert mesh.mesh_dim_names == ("dp_replicate",), mesh.mesh_dim_names
    assert acc.data_parallel_rank == mesh.get_local_rank("dp_replicate") == acc.process_index
    assert acc.data_parallel_shard_rank == 0 and acc.tensor_parallel_rank == 0
    model = train(acc)
    assert isinstance(model, torch.nn.parallel.DistributedDataParallel), type(model)
    assert max_diff(full_params(acc, model), want) < TOL

# -- not built: refused in one line, never run as something else ------------------------------------------------
one_line_error(NotBuiltError, ("cp_size=2 on cpu", "context parallelism needs CUDA"), cp_size=2)
one_line_error(ConfigError, ("sp_size=2", "sp_backend='deepspeed' needs DeepSpeed"), sp_size=2)
one_line_error(ConfigError, ("multiply to 3",), dp_shard_size=3)

print(f"rank {torch.distributed.get_rank()}: parallelism layout checks passed")
