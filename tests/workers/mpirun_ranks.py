"""Started by `hasten launch --mpirun_hostfile ...` (mpirun, not torchrun): each process finds its rank from MPI's
own variables, joins the group and sums its rank. Prints `MPI <rank> <world> <sum> <mixed_precision> <ccl>`."""

import os
import sys

import torch
import torch.distributed as dist

from hasten import Accelerator

assert "LOCAL_RANK" not in os.environ, "started by torchrun, not mpirun"
accelerator = Accelerator()
total = torch.tensor([float(accelerator.process_index)])
dist.all_reduce(total)
# One write per line: the two processes share the launcher's stdout, and print() writes the text and the newline
# separately when the stream is unbuffered, so lines of two processes could run together.
sys.stdout.write(f"MPI {accelerator.process_index} {accelerator.num_processes} {int(total.item())} "
                 f"{accelerator.mixed_precision} {os.environ.get('CCL_WORKER_COUNT')} {accelerator.distributed_type}\n")
sys.stdout.flush()
