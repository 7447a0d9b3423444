"""A full disk in the middle of save_state, in real processes: `disk_full.py ROOT`. Run by
tests/checkpoint/test_disk_full.py.

Each rank saves checkpoint_0, then every later save runs out of space on the rank named by DISK_FULL_RANK
(all ranks with "all"), through the test hook HASTEN_TEST_DISK_FULL_AFTER set after so many bytes, synchronously
and then asynchronously. Each failed save must raise DiskFullError on every rank, in one line, naming a file of
the checkpoint and the bytes it needs; leave no temporary folder; leave checkpoint_0 loadable; and training goes
on: the next save, with room again, commits and loads.
"""

import os
import sys

import torch

from hasten import Accelerator, ProjectConfiguration
from hasten.checkpoint import async_save
from hasten.checkpoint.storage import checksum
from hasten.core.errors import DiskFullError

root = sys.argv[1]
acc = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=root, automatic_checkpoint_naming=True))
torch.manual_seed(0)
model = torch.nn.Linear(32, 32)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
model, optimizer = acc.prepare(model, optimizer)


def step():
    acc.backward(model(torch.randn(4, 32)).pow(2).mean())
    optimizer.step()
    optimizer.zero_grad()


step()
first = acc.save_state()
saved = {k: v.clone() for k, v in model.state_dict().items()}
ckpts = os.path.dirname(first)
full_rank = os.environ["DISK_FULL_RANK"]
for limit in (0, 5000, 9000):  # before the first file, inside the optimizer file, at the marker or after it
    for background in (False, True):
        step()
        if full_rank in ("all", str(acc.process_index)):
            os.environ[checksum.DISK_FULL_ENV] = str(limit)
            checksum._written_bytes[0] = 0
        try:
            acc.save_state(async_save=background)
            async_save.wait()  # an asynchronous save's error comes here (or at the next save_state)
            message = None
        except DiskFullError as error:
            message = str(error)
        finally:
            os.environ.pop(checksum.DISK_FULL_ENV, None)
        if message is None:
            print(f"rank {acc.process_index} NO-ERROR limit={limit} async={background}", flush=True)
            continue
        assert "\n" not in message, message
        hidden = [n for n in os.listdir(ckpts) if n.startswith(".")]
        assert not hidden, hidden
        print(f"rank {acc.process_index} FULL limit={limit} async={background}: {message}", flush=True)
        acc.wait_for_everyone()

# Training went on; checkpoint_0 is intact; with room again the next save commits.
acc.wait_for_everyone()
step()
last = acc.save_state()
acc.load_state(first)
assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
acc.load_state(last)
print(f"rank {acc.process_index} DONE {sorted(os.listdir(ckpts))}", flush=True)
