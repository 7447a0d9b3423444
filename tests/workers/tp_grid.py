"""Layouts of 4 processes (a 2×2 mesh), each against one process (tp_common.reference, TOL): FSDP×TP
(dp_shard 2 × tp 2), replicas of a TP model (dp_replicate 2 × tp 2: FSDP2 over ("dp_replicate", "dp_shard") with one
shard), and HSDP (dp_replicate 2 × dp_shard 2, no TP), which resumes the FSDP×TP checkpoint and continues identically.
Rank properties equal what the mesh says in each; one TP group reads the same batches.
Usage: tp_grid.py <folder>"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from tp_common import GLOBAL_BATCH, fresh_accelerator, loss_of, make_model, max_diff, reference, sgd, tokens, whole
from hasten import ParallelismConfig
from hasten.data.ranks import data_ranks

TOL = 1e-5
STEPS = range(3)
want, _ = reference(STEPS)
want_more, _ = reference(range(5))
folder = os.path.join(sys.argv[1], "fsdp_tp_ckpt")
rank = int(__import__("os").environ["RANK"])

for sizes, dims, backend in (
    (dict(dp_shard_size=2, tp_size=2), ("dp_shard", "tp"), "tensor_parallel"),
    (dict(dp_replicate_size=2, tp_size=2), ("dp_replicate", "dp_shard", "tp"), "tensor_parallel"),
    (dict(dp_replicate_size=2, dp_shard_size=2), ("dp_replicate", "dp_shard"), "fsdp"),
):
    acc = fresh_accelerator(parallelism_config=ParallelismConfig(**sizes))
    mesh = acc.torch_device_mesh
    assert mesh.mesh_dim_names == dims and acc._backend.name == backend, (mesh.mesh_dim_names, acc._backend.name)
    local = {name: mesh.get_local_rank(name) for name in dims}
    assert acc.tensor_parallel_rank == local.get("tp", 0)
    assert acc.data_parallel_rank == local.get("dp_replicate", 0)
    assert acc.data_parallel_shard_rank == local.get("dp_shard", 0)
    assert acc.context_parallel_rank == 0
    coordinates = [None] * 4
    dist.all_gather_object(coordinates, (rank, tuple(local.values())))
    assert len({c for _, c in coordinates}) == 4  # every rank a different point of the mesh
    size, index = data_ranks(mesh)
    dp = [name for name in dims if name.startswith("dp_")]
    assert size == mesh.size() // (2 if "tp" in dims else 1), size
    assert index == (local[dp[0]] * mesh.size(dims.index(dp[1])) + local[dp[1]] if len(dp) == 2 else local[dp[0]])
    model = make_model()
    opt = sgd(model.parameters())
    loader = torch.utils.data.DataLoader(torch.arange(10), batch_size=2)
    model, opt, loader = acc.prepare(model, opt, loader)
    seen = [b.tolist() for b in loader]
    everyone = [None] * 4
    dist.all_gather_object(everyone, (index, seen))
    for other_index, other_seen in everyone:  # same data-parallel index: same batches; else different ones
        assert (other_seen == seen) == (other_index == index), everyone
    gathered = torch.cat([acc.gather_for_metrics(b) for b in loader])
    assert sorted(gathered.tolist()) == list(range(10)), gathered  # each sample once across the mesh
    q = model.blocks[0].attn.q_proj.weight
    assert isinstance(q, DTensor) and q.device_mesh.ndim == len(dims), q.device_mesh
    per = GLOBAL_BATCH // size
    resumes = backend == "fsdp"  # HSDP continues from the FSDP×TP checkpoint
    if resumes:
        acc.load_state(folder)
    for step in range(3, 5) if resumes else STEPS:
        acc.backward(loss_of(model, tokens(step)[index * per:(index + 1) * per]))
        opt.step()
        opt.zero_grad()
    expected = want_more if resumes else want
    assert max_diff(whole(model.state_dict()), expected) < TOL, (sizes, max_diff(whole(model.state_dict()), expected))
    if "dp_shard_size" in sizes and "tp_size" in sizes:
        acc.save_state(folder)

print(f"rank {rank}: grid checks passed")
