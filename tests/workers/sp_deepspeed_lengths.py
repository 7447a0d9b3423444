"""Accelerate's `sp_size` with DeepSpeed (ALST/Ulysses) on 2 processes, ZeRO stage argv[2], with sequences of 16 and
12 tokens on the two ranks (as the data of Accelerate's sp-alst.py example; gloo refused DeepSpeed's all-gather of
the uneven batches), SGD; launched by tests/distributed/test_sequence_parallel.py. 4 steps of Accelerate's loss recipe
(each rank's loss all-gathered over the sp group, averaged by tokens), clipped at argv[3] (0: no clipping) as the
one-process reference on whole sequences is (the batches in the order the loader adapter hands them out).
Writes <folder>/result.json on rank 0: `loss` (over the 4 steps) and `weights` (after them) = max |difference| from
one process. With `helper` last, the loss goes through `true_gradient_loss(loss, model)`, which makes the gradient the
true one at every stage (seen without clipping). Usage: sp_deepspeed_lengths.py <folder> <stage> <clip> [helper]
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from sp_common import VOCAB, accelerate_sp_loss, collate, fresh_accelerator, make_model, max_diff, whole

from hasten import DeepSpeedPlugin, ParallelismConfig
from hasten.backends.deepspeed.ulysses import true_gradient_loss
from hasten.utils.dataclasses import DeepSpeedSequenceParallelConfig

folder, stage, clip = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
helper = sys.argv[4:] == ["helper"]  # back-propagate true_gradient_loss(loss, model)
STEPS, LR = 4, 0.5
g = torch.Generator().manual_seed(11)
data = [torch.randint(1, VOCAB, (16 if i % 2 == 0 else 12,), generator=g) for i in range(STEPS)]


def with_positions(rows):
    batch = collate(rows)
    batch["position_ids"] = torch.arange(batch["input_ids"].shape[1]).expand_as(batch["input_ids"])
    del batch["attention_mask"]  # DeepSpeed's Ulysses drops it (causal attention over the whole sequence)
    return batch


def reference():
    """One process on whole sequences: (losses, the weights after the last step)."""
    model = make_model(attn="eager")  # DeepSpeed put its Ulysses wrapper in transformers' registry under "sdpa"
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        batch = collate(data[step:step + 1])
        logits = model(input_ids=batch["input_ids"]).logits
        shift = torch.nn.functional.pad(batch["labels"][:, 1:], (0, 1), value=-100)
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, VOCAB), shift.reshape(-1))
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, {k: v.detach().clone().float() for k, v in model.state_dict().items()}


def train():
    config = ParallelismConfig(sp_backend="deepspeed", sp_size=2, sp_handler=DeepSpeedSequenceParallelConfig(
        sp_seq_length=16, sp_seq_length_is_variable=True, sp_attn_implementation="sdpa"))
    acc = fresh_accelerator(parallelism_config=config,
                            deepspeed_plugin=DeepSpeedPlugin(hf_ds_config={
                                "train_micro_batch_size_per_gpu": 1, "gradient_clipping": clip,
                                "zero_optimization": {"stage": stage}}))
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    dl = torch.utils.data.DataLoader(data, batch_size=1, shuffle=False, collate_fn=with_positions)
    model, opt, dl = acc.prepare(model, opt, dl)
    from deepspeed.utils import groups

    group = groups._get_sequence_parallel_group()
    unwrapped = acc.unwrap_model(model)
    losses = []
    for _, batch in zip(range(STEPS), dl):
        loss = accelerate_sp_loss(model, unwrapped, batch, acc.device, group)
        acc.backward(true_gradient_loss(loss, model) if helper else loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    state = acc.get_state_dict(model)  # every rank: a collective under ZeRO-3
    return losses, whole(state) if dist.get_rank() == 0 else None


want_losses, want_weights = reference()
losses, weights = train()  # one training a process: DeepSpeed makes its sp groups once
if dist.get_rank() == 0:
    result = {"loss": max(abs(a - b) for a, b in zip(losses, want_losses)), "weights": max_diff(weights, want_weights)}
    with open(os.path.join(folder, "result.json"), "w") as f:
        json.dump(result, f)
    print("sp_deepspeed_lengths", json.dumps(result), flush=True)
