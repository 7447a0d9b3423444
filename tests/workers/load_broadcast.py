"""load_checkpoint_in_model(broadcast_from_rank0=True) on 2 processes, launched by
tests/distributed/test_sequence_parallel.py: an FSDP2-sharded model (dp_shard 2) is filled from a checkpoint only rank
0 reads (rank 1 is given a path that does not exist), each rank keeping its shards; the whole weights then equal the
checkpoint's. Usage: load_broadcast.py <folder>
"""

import os
import sys

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from tp_common import fresh_accelerator, make_model, max_diff, whole
from hasten import ParallelismConfig
from hasten.big_modeling import load_checkpoint_in_model

folder = sys.argv[1]
acc = fresh_accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2))
source = make_model(seed=1)
path = os.path.join(folder, "weights.safetensors")
if acc.is_main_process:
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, path)
acc.wait_for_everyone()
model = acc.prepare(make_model(seed=0))
before = max_diff(whole(model.state_dict()), source.state_dict())
load_checkpoint_in_model(model, path if acc.is_main_process else os.path.join(folder, "absent.safetensors"),
                         broadcast_from_rank0=True, strict=True)
after = max_diff(whole(model.state_dict()), source.state_dict())
assert before > 1e-3 and after == 0.0, (before, after)
assert any(type(p).__name__ == "DTensor" for p in model.parameters())  # still sharded
print(f"rank {dist.get_rank()}: broadcast load ok")
torch.distributed.barrier()
