"""Accelerate's `sp_size` with DeepSpeed (sp_backend "deepspeed", ALST/Ulysses) on 2 processes, ZeRO stage argv[2],
launched by tests/distributed/test_sequence_parallel.py. Accelerate's own recipe (its test script's loop): the loader
adapter hands both sp ranks the same batch cut in two, the loss is combined over the sp group. Trains a tiny Llama 4
steps and compares with one process on whole sequences (one batch a step: DeepSpeed's data-parallel world is 1).
Both clip at 1.0 (Accelerate's default for DeepSpeed). Writes <folder>/result.json. Usage: sp_deepspeed.py <folder> <stage>
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from sp_common import (
    SEQ,
    VOCAB,
    accelerate_sp_loss,
    collate,
    fresh_accelerator,
    make_model,
    max_diff,
    samples,
    whole,
)

from hasten import DeepSpeedPlugin, ParallelismConfig
from hasten.utils.dataclasses import DeepSpeedSequenceParallelConfig

folder, stage = sys.argv[1], int(sys.argv[2])
STEPS, LR = 4, 0.2
result = {}


def with_positions(rows):
    batch = collate(rows)
    batch["position_ids"] = torch.arange(batch["input_ids"].shape[1]).expand_as(batch["input_ids"])
    del batch["attention_mask"]  # DeepSpeed's Ulysses drops it (causal attention over the whole sequence)
    return batch


data = samples(STEPS * 2, variable=False)
config = ParallelismConfig(sp_backend="deepspeed", sp_size=2, sp_handler=DeepSpeedSequenceParallelConfig(
    sp_seq_length=SEQ, sp_seq_length_is_variable=True, sp_attn_implementation="sdpa"))
acc = fresh_accelerator(parallelism_config=config, deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage,
                                                                                    gradient_clipping=1.0))
assert acc.torch_device_mesh is None  # DeepSpeed keeps its own sp groups
model = make_model()
opt = torch.optim.SGD(model.parameters(), lr=LR)
dl = torch.utils.data.DataLoader(data, batch_size=1, shuffle=False, collate_fn=with_positions)
model, opt, dl = acc.prepare(model, opt, dl)
result["train_batch_size"] = acc.deepspeed_config["train_batch_size"]
result["loader_length"] = len(dl)
from deepspeed.utils import groups  # noqa: E402

group = groups._get_sequence_parallel_group()
unwrapped = acc.unwrap_model(model)
losses = []
for _, batch in zip(range(STEPS), dl):
    loss = accelerate_sp_loss(model, unwrapped, batch, acc.device, group)
    acc.backward(loss)
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())

# one process: the batches in the order the adapter hands them out (rank 0's, then rank 1's, ...)
ref = make_model(attn="eager")  # DeepSpeed put its Ulysses wrapper in transformers' registry under "sdpa"
ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
want = []
for step in range(STEPS):
    batch = collate(data[step:step + 1])
    logits = ref(input_ids=batch["input_ids"]).logits
    shift = torch.nn.functional.pad(batch["labels"][:, 1:], (0, 1), value=-100)
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), shift.reshape(-1), ignore_index=-100)
    loss.backward()
    # Accelerate's recipe (an all-gathered loss) gives every sp rank the gradient of the whole loss; ZeRO-2 adds the
    # sp ranks' up (sp_size times the gradient), ZeRO-3 averages them: clipping at 1.0 (Accelerate's default) hides
    # the difference (sp_deepspeed_lengths.py shows it without clipping).
    torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
    ref_opt.step()
    ref_opt.zero_grad()
    want.append(loss.item())
result["loss"] = max(abs(a - b) for a, b in zip(losses, want))
# a loader prepared apart from the model is not cut (as Accelerate); deepspeed_ulysses_dl_adapter cuts it
apart = acc.prepare(torch.utils.data.DataLoader(data, batch_size=1, shuffle=False, collate_fn=with_positions))
assert not hasattr(apart, "sp_rank") and next(iter(apart))["input_ids"].shape[1] == SEQ
adapted = acc.deepspeed_ulysses_dl_adapter(apart, model)
piece = next(iter(adapted))
result["adapter"] = {"length": len(adapted), "seq": piece["input_ids"].shape[1], "keys": sorted(piece)}
state = acc.get_state_dict(model)
if dist.get_rank() == 0:
    result["weights"] = max_diff(whole(state), {k: v.detach() for k, v in ref.state_dict().items()})
    with open(os.path.join(folder, "result.json"), "w") as f:
        json.dump(result, f)
print("sp_deepspeed", json.dumps(result))
