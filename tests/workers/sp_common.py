"""Shared pieces of the sequence-parallel test scripts: a tiny Llama built from a config (4 query heads, 2 key/value
heads), token batches of fixed or varying length, and the one-process reference on whole sequences."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hasten import Accelerator
from hasten.state import AcceleratorState, GradientState

VOCAB, SEQ, ROWS, STEPS, LR = 64, 12, 2, 5, 0.2


def make_model(seed=0, kv_heads=2, attn="sdpa"):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=128,
                         attn_implementation=attn)
    return LlamaForCausalLM(config)


def samples(count: int, variable: bool, seed: int = 7):
    """`count` token sequences: all SEQ long, or 3..SEQ+1 long (odd lengths included, so padding to sp happens)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, SEQ + 2, (count,), generator=g).tolist() if variable else [SEQ] * count
    return [torch.randint(1, VOCAB, (n,), generator=g) for n in lengths]


def collate(rows):
    """Right padding to the longest row; labels -100 on padding; an attention mask."""
    length = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    labels = torch.full((len(rows), length), -100, dtype=torch.long)
    mask = torch.zeros(len(rows), length, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)], labels[i, :len(r)], mask[i, :len(r)] = r, r, 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def loader(data, rows=ROWS):
    return torch.utils.data.DataLoader(data, batch_size=rows, shuffle=False, collate_fn=collate)


def reference(data, dp: int, steps=STEPS, rows=ROWS, seed=0, attn="sdpa"):
    """One process on whole sequences: each step takes dp batches of `rows` (as the data-parallel ranks read them)
    and averages their mean token losses (DDP's mean of the ranks' means). Returns (losses, weights)."""
    model = make_model(seed, attn=attn)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        parts = []
        for r in range(dp):
            first = (step * dp + r) * rows
            batch = collate(data[first:first + rows])
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            shift = F.pad(batch["labels"][:, 1:], (0, 1), value=-100)
            parts.append(F.cross_entropy(logits.float().reshape(-1, VOCAB), shift.reshape(-1), ignore_index=-100))
        loss = sum(parts) / dp
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def fresh_accelerator(**kwargs) -> Accelerator:
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    return Accelerator(**kwargs)


def train_steps(acc, model, opt, batches, steps):
    """The user's loop under hasten's Ulysses: the model sees its slice, the loss is the whole sequence's mean."""
    from hasten.distributed.sequence_parallel import causal_lm_loss

    losses = []
    for _, batch in zip(range(steps), batches):
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                       attention_mask=batch["attention_mask"]).logits
        loss = causal_lm_loss(logits, batch["shift_labels"])
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(acc.reduce(loss.detach(), reduction="mean").item())
    return losses


def whole(state: dict) -> dict:
    from torch.distributed.tensor import DTensor

    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().float() for k, v in state.items()}


def max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b), (sorted(set(a) ^ set(b)))
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def accelerate_sp_loss(model, unwrapped, batch, device, group):
    """The loss of Accelerate's DeepSpeed-sp recipe (its sp-alst.py example): each sp rank's loss over its own
    tokens, all-gathered and weighted by the ranks' counts of real tokens."""
    out = model(input_ids=batch["input_ids"].to(device), position_ids=batch["position_ids"].to(device))
    shift = batch["shift_labels"].to(device)
    loss = unwrapped.loss_function(logits=out.logits, labels=None, shift_labels=shift, vocab_size=VOCAB)
    losses_per_rank = torch.distributed.nn.functional.all_gather(loss, group=group)
    good = (shift != -100).view(-1).sum()
    good_per_rank = torch.distributed.nn.functional.all_gather(good, group=group)
    return sum(losses_per_rank[r] * good_per_rank[r] for r in range(len(good_per_rank)) if good_per_rank[r] > 0) / max(
        sum(good_per_rank), 1)
