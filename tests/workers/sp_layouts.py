"""hasten's Ulysses composed with data parallelism on 4 processes, launched by tests/distributed/test_sequence_parallel.py:
dp_replicate 2 x sp 2 (DDP over every rank) and dp_shard 2 x sp 2 (FSDP2 over the flattened ("dp_shard", "sp")
view); each trains a tiny Llama 5 steps and equals one process on whole sequences (losses and weights within 1e-5),
the two data-parallel groups reading different batches and the two ranks of an sp group halves of the same one.
Also: token-normalised accumulation over sp ranks equals one process on the whole window. Writes <folder>/result.json.
Usage: sp_layouts.py <folder>
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from sp_common import (
    LR,
    ROWS,
    STEPS,
    collate,
    fresh_accelerator,
    loader,
    make_model,
    max_diff,
    reference,
    samples,
    train_steps,
    whole,
)

from hasten import GradientAccumulationPlugin, ParallelismConfig

TOL = 1e-5
folder = sys.argv[1]
result = {}
data = samples(STEPS * 2 * ROWS, variable=True)
want_losses, want = reference(data, dp=2)

for name, sizes, mesh in (("ddp", {"dp_replicate_size": 2}, ("dp_replicate", "sp")),
                          ("fsdp2", {"dp_shard_size": 2}, ("dp_shard", "sp"))):
    acc = fresh_accelerator(parallelism_config=ParallelismConfig(sp_size=2, sp_backend="hasten", **sizes))
    assert acc.torch_device_mesh.mesh_dim_names == mesh, acc.torch_device_mesh
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    model, opt, dl = acc.prepare(model, opt, loader(data))
    assert acc.is_fsdp2 == (name == "fsdp2")
    losses = train_steps(acc, model, opt, dl, STEPS)
    state = whole(acc.get_state_dict(model))  # whole weights on the main process
    result[name] = {"loss": max(abs(a - b) for a, b in zip(losses, want_losses))}
    if acc.is_main_process:
        result[name]["weights"] = max_diff(state, want)

# -- token-normalised accumulation: 2 micro-steps of one window over dp 2 x sp 2 = one process on all 4 batches' tokens
acc = fresh_accelerator(parallelism_config=ParallelismConfig(sp_size=2, sp_backend="hasten", dp_replicate_size=2),
                        gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2, normalize_by_tokens=True))
model = make_model()
opt = torch.optim.SGD(model.parameters(), lr=LR)
model, opt, dl = acc.prepare(model, opt, loader(data))
for _, batch in zip(range(2), dl):
    with acc.accumulate(model):
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
        # this rank's mean over its own tokens (0 when its slice is all padding) and their count
        items = (batch["shift_labels"] != -100).sum()
        summed = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                   batch["shift_labels"].reshape(-1), ignore_index=-100, reduction="sum")
        acc.backward(summed / items.clamp(min=1), num_items_in_batch=items)
        opt.step()
        opt.zero_grad()
reference_model = make_model()
batch = collate(data[:4 * ROWS])  # the window: 2 micro-steps x 2 data-parallel groups of ROWS rows
logits = reference_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
shift = torch.nn.functional.pad(batch["labels"][:, 1:], (0, 1), value=-100)
torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), shift.reshape(-1),
                                  ignore_index=-100).backward()
with torch.no_grad():
    for p in reference_model.parameters():
        p -= LR * p.grad
result["tokens"] = {"weights": max_diff(whole(acc.unwrap_model(model).state_dict()),
                                        {k: v.detach() for k, v in reference_model.state_dict().items()})}

for name, figures in result.items():
    assert all(value <= TOL for value in figures.values()), (name, figures)
if dist.get_rank() == 0:
    with open(os.path.join(folder, "result.json"), "w") as f:
        json.dump(result, f)
print("sp_layouts ok", json.dumps(result))
