"""Launched on 2 processes: the observability tools in one DDP run (tests/observe/test_step_timer.py reads the output).

Usage: observe_run.py OUT_DIR. Rank 1's dataset sleeps 30 ms per sample, so rank 1 is the straggler. Writes:
OUT_DIR/run/metrics.jsonl (the jsonl tracker, main process), OUT_DIR/trace/profile_<rank>.json (Chrome traces),
OUT_DIR/tb/rank<r>.*.pt.trace.json (TensorBoard traces), OUT_DIR/memory/memory_rank<r>.{json,png}, and
OUT_DIR/rank<r>.json with what this rank saw.
"""

import glob
import importlib.util
import json
import logging
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

from hasten import Accelerator, ProfileKwargs

out = sys.argv[1]


class RankDelayedData(Dataset):
    def __len__(self):
        return 48

    def __getitem__(self, i):
        if os.environ["RANK"] == "1":
            time.sleep(0.03)
        return torch.full((4,), float(i) / 48), torch.tensor([float(i % 3)])


warnings_seen = []


class Collect(logging.Handler):
    def emit(self, record):
        warnings_seen.append(record.getMessage())


logging.getLogger("hasten.observe.step_timer").addHandler(Collect(level=logging.WARNING))

accelerator = Accelerator(log_with="jsonl", project_dir=out)
accelerator.init_trackers("run")
rank = accelerator.process_index
plotted = importlib.util.find_spec("matplotlib") is not None

memory = accelerator.track_memory(os.path.join(out, "memory"), interval=0.02, plot=plotted).start()
held = torch.ones(64 * 1024 * 1024)  # 256 MiB on each rank: its peak shows in the JSON
taken = len(memory._columns["time_s"])
while len(memory._columns["time_s"]) < taken + 3:  # held until sampled, however loaded the machine
    time.sleep(0.02)
del held
memory.mark("training")

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(RankDelayedData(), batch_size=2)  # 12 batches per rank
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
assert len(loader) == 12


def train_step(x, y):
    accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
    optimizer.step()
    optimizer.zero_grad()


# 1. A Chrome trace per rank.
with accelerator.profile(ProfileKwargs(activities=["cpu"], output_trace_dir=os.path.join(out, "trace"))):
    train_step(*next(iter(loader)))

# 2. The step breakdown over an epoch, with a scheduled profiler writing TensorBoard traces.
tb_dir = os.path.join(out, "tb")
scheduled = ProfileKwargs(activities=["cpu"], schedule_option=dict(wait=1, warmup=1, active=2, repeat=2),
                          on_trace_ready=torch.profiler.tensorboard_trace_handler(tb_dir, worker_name=f"rank{rank}"))
with accelerator.track_step_times(log_every=4) as timer, accelerator.profile(scheduled) as prof:
    for x, y in loader:
        train_step(x, y)
        prof.step()
memory.stop()
accelerator.end_training()


def steps_in(path):
    events = json.load(open(path))["traceEvents"]
    return sorted(e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#"))


tensorboard_steps = sorted(steps_in(p) for p in glob.glob(os.path.join(tb_dir, f"rank{rank}.*.pt.trace.json")))
with open(os.path.join(out, f"rank{rank}.json"), "w") as stream:
    json.dump({"history": timer.history, "straggler_warned": any("rank 1 is a straggler" in w for w in warnings_seen),
               "tensorboard_steps": tensorboard_steps, "plotted": plotted}, stream)
print(f"rank {rank} done: {timer.history[-1]}")
