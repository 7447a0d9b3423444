"""Shared pieces of the pipeline-parallel test scripts: a small transformer written as nn.Sequential (embedding,
blocks, norm, head), deterministic token batches, and a one-process reference run."""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F

from tp_common import DIM, VOCAB, Block, fresh_accelerator, max_diff, tokens, whole  # noqa: F401

DEPTH = 4


def make_model(seed=0, depth=DEPTH):
    torch.manual_seed(seed)
    return torch.nn.Sequential(OrderedDict(
        embed=torch.nn.Embedding(VOCAB, DIM),
        blocks=torch.nn.Sequential(*(Block() for _ in range(depth))),
        norm=torch.nn.LayerNorm(DIM),
        head=torch.nn.Linear(DIM, VOCAB),
    ))


def loss_of(model, batch):
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def reference(steps, batch_size=4):
    """Whole parameters and losses of one process training the global batches of `steps`."""
    model = make_model()
    opt = sgd(model.parameters())
    losses = []
    for step in steps:
        loss = loss_of(model, tokens(step, batch_size))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses
