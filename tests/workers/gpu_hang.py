"""The hang doctor on NCCL (tests/gpu/test_hang_doctor_gpu.py, two GPUs, `--debug`): rank 0's all_reduce is only
queued on the GPU, so its call returns, and rank 0 then blocks in `torch.cuda.synchronize()`, outside any collective
call, while rank 1 sleeps instead of joining. The report must still name the all_reduce and rank 1."""

import time

import torch
import torch.distributed as dist

from hasten import Accelerator

accelerator = Accelerator()
rank = accelerator.process_index
tensor = torch.ones(4, device=accelerator.device)
accelerator.wait_for_everyone()
if rank == 0:
    dist.all_reduce(tensor)  # SITE:nccl-all-reduce
    torch.cuda.synchronize()
else:
    time.sleep(300)  # SITE:nccl-sleep
