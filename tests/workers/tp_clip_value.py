"""clip_grad_value_ under tensor parallelism alone (tp 2 on 2 processes), launched by
tests/distributed/test_sequence_parallel.py: 3 steps with every gradient clamped to +-0.01 equal one process doing the
same (the clamp matters: gradients of this model exceed 0.01)."""

import sys

import torch
from tp_common import (
    fresh_accelerator,
    loss_of,
    make_model,
    max_diff,
    sgd,
    tokens,
    whole,
)

from hasten import ParallelismConfig

CLIP = 0.01
acc = fresh_accelerator(parallelism_config=ParallelismConfig(tp_size=2))
model = make_model()
opt = sgd(model.parameters())
model, opt = acc.prepare(model, opt)
ref, loose = make_model(), make_model()
ref_opt, loose_opt = sgd(ref.parameters()), sgd(loose.parameters())
for step in range(3):
    acc.backward(loss_of(model, tokens(step)))
    acc.clip_grad_value_(model.parameters(), CLIP)
    opt.step()
    opt.zero_grad()
    loss_of(ref, tokens(step)).backward()
    torch.nn.utils.clip_grad_value_(ref.parameters(), CLIP)
    ref_opt.step()
    ref_opt.zero_grad()
    loss_of(loose, tokens(step)).backward()  # the same without the clamp: must end elsewhere
    loose_opt.step()
    loose_opt.zero_grad()
diff = max_diff(whole(model.state_dict()), {k: v.detach() for k, v in ref.state_dict().items()})
unclipped = max_diff(whole(model.state_dict()), {k: v.detach() for k, v in loose.state_dict().items()})
assert diff <= 1e-5 and unclipped > 1e-3, (diff, unclipped)
print(f"tp clip_grad_value ok {diff}")
sys.exit(0)
