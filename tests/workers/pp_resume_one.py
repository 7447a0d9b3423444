"""One process (no launcher) resumes the checkpoint pp_layouts.py saved under pp=2 after 3 steps and continues
identically to a one-process run of all 5 steps; it then saves its own checkpoint after step 3, for pp=2 to resume
(pp_layouts.py `resume`). The sharded (DCP) folders load through FSDP2 on a one-process group.
Usage: pp_resume_one.py <folder of pp_layouts.py>"""

import os
import sys

from pp_common import fresh_accelerator, loss_of, make_model, max_diff, reference, sgd, tokens, whole
from hasten import FullyShardedDataParallelPlugin

TOL = 1e-5
folder = sys.argv[1]
want, _ = reference(range(5))


def one_process(load_from=None, save_to=None):
    acc = fresh_accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    assert acc.num_processes == 1
    model = make_model(seed=1 if load_from is not None else 0)  # a resume's weights come from the checkpoint
    opt = sgd(model.parameters())
    model, opt = acc.prepare(model, opt)
    first = 0
    if load_from is not None:
        acc.load_state(load_from)
        first = 3
    for step in range(first, 5):
        loss = loss_of(model, tokens(step))
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        if step == 2 and save_to is not None:
            acc.save_state(save_to)
    got = whole(model.state_dict())
    assert max_diff(got, want) < TOL, max_diff(got, want)


one_process(load_from=os.path.join(folder, "pp_ckpt"))
print("one process resumed the pp=2 checkpoint")
if len(sys.argv) > 2:
    one_process(save_to=os.path.join(folder, "one_ckpt"))
    print("one process saved a checkpoint for pp=2")
