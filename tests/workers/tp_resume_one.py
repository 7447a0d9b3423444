"""One process (no launcher) resumes the checkpoint tp_layouts.py saved under TP=2 and continues identically to a
one-process run of all steps. The sharded (DCP) folders load through FSDP2 on a one-process group, resharded.
Usage: tp_resume_one.py <folder of tp_layouts.py>"""

import os
import sys

import torch

from tp_common import GLOBAL_BATCH, fresh_accelerator, loss_of, make_model, max_diff, reference, sgd, tokens, whole
from hasten import FullyShardedDataParallelPlugin

TOL = 1e-5
folder = sys.argv[1]
want, _ = reference(range(5))
acc = fresh_accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
assert acc.num_processes == 1
model = make_model(seed=1)
opt = sgd(model.parameters())
model, opt = acc.prepare(model, opt)
acc.load_state(os.path.join(folder, "tp_ckpt"))
for step in range(3, 5):
    loss = loss_of(model, tokens(step)[:GLOBAL_BATCH])
    acc.backward(loss)
    opt.step()
    opt.zero_grad()
got = whole(model.state_dict())
assert max_diff(got, want) < TOL, max_diff(got, want)
assert isinstance(got["head.weight"], torch.Tensor)
print("one process resumed the TP=2 checkpoint")
