"""The hang doctor on the default group (tests/gpu/test_hang_doctor_gpu.py, two processes, `--debug`): rank 0's
all_reduce is only queued (NCCL on a GPU; `async_op=True` on the gloo twin), so its call returns, and rank 0 then
blocks outside any collective call (`torch.cuda.synchronize()`, or waiting on the work), while rank 1 sleeps
instead of joining. The report must still name the all_reduce and rank 1.

NCCL connects lazily, at a group's first collective: without the warm-up below rank 0 blocked *inside* the
all_reduce, connecting to rank 1, and the call never returned (issue 30, item 4)."""

import time

import torch
import torch.distributed as dist
from gpu_common import ON_GPU

from hasten import Accelerator

accelerator = Accelerator()
rank = accelerator.process_index
tensor = torch.ones(4, device=accelerator.device)
dist.all_reduce(torch.ones(1, device=accelerator.device))  # the warm-up: both ranks, connects NCCL
accelerator.wait_for_everyone()
if rank == 0:
    work = dist.all_reduce(tensor, async_op=not ON_GPU)  # SITE:nccl-all-reduce
    torch.cuda.synchronize() if ON_GPU else work.wait()
else:
    time.sleep(300)  # SITE:nccl-sleep
