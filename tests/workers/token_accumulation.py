"""Token-normalised gradient accumulation in real processes (run by tests/test_token_accumulation.py).

Variable-length sequences (padding labelled -100), GA=4, a prepared DataLoader whose epoch ends on a shorter window
(6 batches per process: windows of 4 and 2). For each window, under DDP and under FSDP2: the gradient equals one
process's gradient of the token-mean loss over all the window's tokens on all processes (1e-6); Accelerate's
default (mean of the micro-batches' means) is checked to be what the flag-less run computes, and to differ."""

import torch
import torch.nn.functional as F

from hasten import Accelerator, FullyShardedDataParallelPlugin, GradientAccumulationPlugin
from hasten.state import AcceleratorState, GradientState
from hasten.utils import gather_object

VOCAB, DIM, GA, TOL, WORLD = 16, 8, 4, 1e-6, 2


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, x):
        return self.head(torch.tanh(self.embed(x)))


def samples():
    g = torch.Generator().manual_seed(7)
    out = []
    for i in range(24):
        length = int(torch.randint(1, 12, (1,), generator=g))
        ids = torch.randint(0, VOCAB, (12,), generator=g)
        labels = torch.randint(0, VOCAB, (12,), generator=g)
        labels[length:] = -100
        out.append((ids, labels))
    return out


def loss_of(model, ids, labels):
    return F.cross_entropy(model(ids).reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)


def reference(window, token_mean: bool):
    """One process on the window's micro-batches of every process: the token mean, or Accelerate's mean of the
    micro-batches' means (each divided by the accumulation steps, averaged over the processes)."""
    torch.manual_seed(0)
    model = TinyLM()
    if token_mean:
        ids = torch.cat([b[0] for b in window])
        labels = torch.cat([b[1] for b in window])
        loss_of(model, ids, labels).backward()
    else:
        for ids, labels in window:  # Accelerate divides by the steps even in the shorter last window
            (loss_of(model, ids, labels) / (GA * WORLD)).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def run(normalize: bool, fsdp: bool):
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    plugin = GradientAccumulationPlugin(num_steps=GA, normalize_by_tokens=normalize)
    acc = Accelerator(gradient_accumulation_plugin=plugin,
                      fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2) if fsdp else None)
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: every window starts from the same weights
    loader = torch.utils.data.DataLoader(samples(), batch_size=2, shuffle=False)
    model, opt, loader = acc.prepare(model, opt, loader)
    window, windows = [], []
    for ids, labels in loader:
        with acc.accumulate(model):
            loss = loss_of(model, ids, labels)
            if normalize:
                acc.backward(loss, num_items_in_batch=(labels != -100).sum())
            else:
                acc.backward(loss)
            window.append((ids, labels))
            if acc.sync_gradients:
                everyone = [b for part in gather_object([window]) for b in part]
                grads = {}
                for name, p in model.named_parameters():
                    g = p.grad
                    grads[name.removeprefix("module.")] = g.full_tensor() if hasattr(g, "full_tensor") else g.clone()
                windows.append((everyone, grads))
                window = []
            opt.step()
            opt.zero_grad()
    assert [len(w) for w, _ in windows] == [2 * GA, 2 * 2], [len(w) for w, _ in windows]  # the last is shorter
    worst_token, worst_naive, gap = 0.0, 0.0, 0.0
    for everyone, grads in windows:
        token = reference(everyone, token_mean=True)
        naive = reference(everyone, token_mean=False)
        for name in token:
            worst_token = max(worst_token, (grads[name] - token[name]).abs().max().item())
            worst_naive = max(worst_naive, (grads[name] - naive[name]).abs().max().item())
            gap = max(gap, (token[name] - naive[name]).abs().max().item())
    assert gap > 1e-3, gap  # the two definitions differ measurably on these batches
    kind = "FSDP2" if fsdp else "DDP"
    if normalize:
        assert worst_token < TOL, (kind, worst_token)
        acc.print(f"TOKEN OK {kind}: token-mean within {worst_token:.2g}; mean of means differs by {gap:.3g}")
    else:
        assert worst_naive < TOL, (kind, worst_naive)
        acc.print(f"NAIVE OK {kind}: default is the mean of means (within {worst_naive:.2g})")


run(normalize=False, fsdp=False)
run(normalize=True, fsdp=False)
run(normalize=True, fsdp=True)
