"""Injected deadlocks for debug mode's hang doctor, one per launch: argv[1] names the case.

Run under `hasten launch --debug` by tests/resilience/test_hang_doctor.py, which finds each call site by the `SITE:` marker
on its line and checks that the report names the right rank and lines. Every case would hang for the whole
collective timeout (30 minutes by default) without the doctor.
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from hasten import Accelerator
from hasten.utils import broadcast, gather, reduce

accelerator = Accelerator(cpu=True)
rank = accelerator.process_index
t = torch.ones(4)


def skip_barrier():
    if rank == 0:
        accelerator.wait_for_everyone()  # SITE:skip-barrier-wait
    reduce(t)  # SITE:skip-barrier-reduce


def conditional():
    if rank == 1:
        gather(t)  # SITE:conditional-gather
    accelerator.wait_for_everyone()  # SITE:conditional-wait


def shapes():
    gather(torch.zeros(rank + 1, 2))  # SITE:shapes


def dtypes():
    reduce(torch.zeros(2, dtype=torch.float32 if rank == 0 else torch.float64))  # SITE:dtypes


def skip_eval():
    batches = [torch.tensor([step]) for step in range(3 if rank == 0 else 2)]
    for batch in batches:
        accelerator.gather_for_metrics(batch)  # SITE:eval-gather
    accelerator.wait_for_everyone()  # SITE:eval-wait


def sleeps():
    if rank == 1:
        time.sleep(300)  # SITE:sleep
    accelerator.wait_for_everyone()  # SITE:sleep-wait


def frozen():
    # a node that hangs without dying: the process is alive but never runs again (SIGSTOP)
    if rank == 1:
        time.sleep(2)  # some work first: its heartbeat leaves where it was  # SITE:frozen-work
        os.kill(os.getpid(), signal.SIGSTOP)  # SITE:frozen
    accelerator.wait_for_everyone()  # SITE:frozen-wait


def frozen_in_backward():
    # the same, while the other rank waits in DDP's gradient all-reduce (made in C++: the doctor does not see it)
    model = accelerator.prepare(torch.nn.Linear(4, 1))
    if rank == 1:
        time.sleep(2)  # SITE:frozen-backward-work
        os.kill(os.getpid(), signal.SIGSTOP)
    accelerator.backward(model(t).sum())  # SITE:frozen-backward


def broadcast_vs_all_reduce():
    if rank == 0:
        broadcast(t)  # SITE:broadcast
    else:
        dist.all_reduce(t)  # SITE:all-reduce


def user_all_reduce():
    dist.all_reduce(torch.ones(3 + rank))  # SITE:user-all-reduce


def queued():
    # NCCL's shape on CPU: the call returns at once and the collective never completes; then the rank blocks
    # elsewhere (here: sleeping) instead of inside a collective call.
    if rank == 0:
        dist.all_reduce(t, async_op=True)  # SITE:queued-all-reduce
        time.sleep(300)  # SITE:queued-sleep-0
    else:
        time.sleep(300)  # SITE:queued-sleep-1


def exits_early():
    if rank == 1:
        return
    accelerator.wait_for_everyone()  # SITE:exit-wait


def raises():
    if rank == 1:
        raise ValueError("rank 1 fails on purpose")  # SITE:raise
    accelerator.wait_for_everyone()  # SITE:raise-wait


accelerator.wait_for_everyone()  # every rank is up and has passed one collective
globals()[sys.argv[1].replace("-", "_")]()
print(f"RANK {rank} FINISHED", flush=True)
