"""`orphan_worker.py DIR`: join the group, start a data-loader worker, write this worker's pid and its
data-loader worker's pid to DIR, then train forever. Run by tests/resilience/test_orphans.py, which SIGKILLs
the launcher and expects every one of these processes gone."""

import os
import sys
import time

import torch

from hasten import Accelerator


class Forever(torch.utils.data.IterableDataset):
    def __iter__(self):
        with open(os.path.join(sys.argv[1], f"loader-{os.getpid()}"), "w"):
            pass
        while True:
            yield torch.zeros(2)


acc = Accelerator()
batches = iter(torch.utils.data.DataLoader(Forever(), batch_size=2, num_workers=1))
next(batches)
with open(os.path.join(sys.argv[1], f"worker-{os.getpid()}"), "w"):
    pass
while True:  # a run that would go on for ever without its launcher
    next(batches)
    time.sleep(0.05)
