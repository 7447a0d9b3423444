"""A correct run under the hang doctor: nothing may be reported, and the doctor is there only in debug mode.

Run by tests/resilience/test_hang_doctor.py with and without `--debug`. Checks, on two processes:
- debug off: torch.distributed's functions are torch's own, hasten.resilience.hang_doctor is not active;
- debug on: they are the doctor's wrappers, old store keys are deleted, every collective gets checked, and none of these legitimate patterns is reported: a rank that is
  slow (past the doctor's wait) to reach a barrier, the same collective called from different lines, object
  collectives, a subgroup, an async collective, and hasten's own operations.
"""

import time

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from hasten import Accelerator
from hasten.resilience import hang_doctor
from hasten.utils import broadcast_object_list, gather, gather_object, reduce

accelerator = Accelerator(cpu=True)
rank = accelerator.process_index
debug = accelerator.state.debug

wrapped = [name for name in hang_doctor.WRAPPED if getattr(getattr(dist, name), "_hasten_doctor", False)]
if debug:
    assert hang_doctor.active()
    assert hang_doctor._DOCTOR.wait == 1.0  # HASTEN_HANG_DOCTOR_WAIT=1 (the test's) is the doctor's wait (default 2)
    assert wrapped == list(hang_doctor.WRAPPED), wrapped
    assert c10d.all_reduce is dist.all_reduce and c10d.all_reduce.__wrapped__ is not None
else:
    assert not hang_doctor.active() and wrapped == [], wrapped
    assert not hasattr(dist.all_reduce, "__wrapped__") or not getattr(dist.all_reduce, "_hasten_doctor", False)
    assert dist.all_reduce.__module__ == "torch.distributed.distributed_c10d"

if rank == 0:
    time.sleep(3)  # slower than the doctor's wait (HASTEN_HANG_DOCTOR_WAIT=1 in the test): not a hang
accelerator.wait_for_everyone()

t = torch.full((3,), float(rank + 1))
if rank == 0:
    dist.all_reduce(t)
else:
    dist.all_reduce(t)  # another line, the same collective: fine
assert t.tolist() == [3.0, 3.0, 3.0], t

assert gather(torch.tensor([rank])).tolist() == [0, 1]
assert reduce(torch.tensor([1.0]), "sum").item() == 2.0
assert gather_object([rank]) == [0, 1]
objects = [rank]
broadcast_object_list(objects, from_process=1)
assert objects == [1]

odd = dist.new_group([1])  # a group rank 0 is not in: its collectives are not rank 0's business
if rank == 1:
    x = torch.ones(1)
    dist.all_reduce(x, group=odd)
work = dist.all_reduce(torch.ones(2), async_op=True)
work.wait()
pair = dist.new_group([0, 1])
y = torch.ones(2)
dist.all_reduce(y, group=pair)
assert y.tolist() == [2.0, 2.0]
if debug:
    # The store keeps only the last chunks of collective fingerprints: a long run does not grow the job's store
    # forever. Rank 0 (the default group's reference rank) posts them and deletes the old chunks.
    for _ in range(hang_doctor._CHUNK * (hang_doctor._KEEP_CHUNKS + 2)):
        dist.all_reduce(y)
    doctor = hang_doctor._DOCTOR
    assert doctor.flush(60), "the checker did not catch up"
    if rank == 0:
        last = (doctor.seqs["default"] - 1) // hang_doctor._CHUNK
        for _ in range(100):
            if not doctor.store.check(["c/default/0"]):
                break
            time.sleep(0.1)
        assert not doctor.store.check(["c/default/0"]), "old fingerprint chunks are not deleted"
        assert doctor.store.check([f"c/default/{last}"])
accelerator.wait_for_everyone()
print(f"HEALTHY RANK {rank} debug={debug}", flush=True)
