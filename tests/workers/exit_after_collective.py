"""A script that ends right after a collective, with gloo's worker threads starved of CPU (run by
tests/distributed/test_bootstrap.py).

Its prepared model keeps the process group alive past `end_training()`, as DDP does, so gloo's worker threads
live on into interpreter exit. Starving those threads (lowest priority, one CPU) makes the race that load causes
(a worker thread dropping its last finished operation after the interpreter began finalizing) happen nearly every
time: without hasten's exit hook, plain PyTorch aborts with `terminate called without an active exception`.
Prints `EXIT CHECK <name>` per check and process; the test also needs exit code 0.
"""

import os
import sys
import time

import torch

from hasten import Accelerator
from hasten.distributed.bootstrap import gloo_worker_activity

accelerator = Accelerator()
workers = gloo_worker_activity()
deadline = time.monotonic() + 10
while not workers and time.monotonic() < deadline:  # a new thread names itself once it runs: under load, later
    time.sleep(0.01)
    workers = gloo_worker_activity()
if sys.platform.startswith("linux"):
    # The exit hook finds gloo's worker threads by name; a torch that renames them would make it wait for nothing.
    assert len(workers) >= 1, f"no gloo worker threads found by name in {os.listdir('/proc/self/task')}"
    print("EXIT CHECK worker threads found", flush=True)
    cpu = sorted(os.sched_getaffinity(0))[0]
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), {cpu})
    for tid in workers:
        os.setpriority(os.PRIO_PROCESS, int(tid), 19)

model = accelerator.prepare(torch.nn.Linear(8, 1))
model(torch.randn(4, 8)).sum().backward()
for _ in range(5):
    accelerator.reduce(torch.ones(1000))
print("EXIT CHECK collectives done", flush=True)
accelerator.end_training()
