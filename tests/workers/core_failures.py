"""Ways a launched run can end, chosen by argv[1]; used by tests/commands/test_launch_core.py.

crash          rank 1 raises after the group is up; rank 0 is waiting in a barrier.
killed         rank 1 is killed by SIGKILL (as by the OOM killer): no Python error anywhere on rank 1.
restart        attempt 0: rank 1 crashes mid-run; attempt 1 (after torchelastic restarts): everyone succeeds.
no-destroy     collectives, then exit without destroy_process_group (hasten's atexit teardown must cope).
mismatch       under --debug: a gather whose shapes differ across ranks, uncaught.
exit           one process: exit with the code given in argv[2].
"""

import os
import sys

import torch

from hasten import PartialState
from hasten.utils import gather, reduce

mode = sys.argv[1]
if mode == "exit":
    sys.exit(int(sys.argv[2]))

state = PartialState()
rank = state.process_index
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

if mode == "crash":
    state.wait_for_everyone()
    if rank == 1:
        raise ValueError("rank 1 fails on purpose")
    state.wait_for_everyone()
elif mode == "killed":
    import signal

    state.wait_for_everyone()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    state.wait_for_everyone()
elif mode == "restart":
    total = reduce(torch.tensor([1.0]), "sum").item()
    assert total == state.num_processes
    if attempt == 0 and rank == 1:
        raise RuntimeError("attempt 0 fails on purpose")
    state.wait_for_everyone()
    for _ in range(3):
        assert gather(torch.tensor([rank])).tolist() == list(range(state.num_processes))
    print(f"ATTEMPT {attempt} RANK {rank} OK", flush=True)
elif mode == "no-destroy":
    for step in range(3):
        assert reduce(torch.tensor([float(step)]), "sum").item() == step * state.num_processes
    state.wait_for_everyone()
    print(f"NO-DESTROY RANK {rank} DONE", flush=True)
elif mode == "mismatch":
    gather(torch.zeros(rank + 1, 4))
else:
    raise SystemExit(f"unknown mode {mode!r}")
