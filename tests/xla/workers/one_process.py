"""An Accelerate-style script on torch_xla's one CPU device (`xla:0`), run unchanged under hasten: the whole loop
with accumulation, every collective, save_state -> load_state -> identical continuation, save_model, and
gather_for_metrics exact on an uneven set. Prints OK at the end."""

import os
import sys
import tempfile

import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator
from hasten.utils import (
    broadcast,
    broadcast_object_list,
    gather,
    gather_object,
    pad_across_processes,
    reduce,
    set_seed,
)


def make(accelerator, n=10, batch_size=4):
    generator = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.5)
    x = torch.randn(n, 3, generator=generator)
    y = x.sum(1, keepdim=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(1))
    return (*accelerator.prepare(model, optimizer, loader), x)


def epoch(accelerator, model, optimizer, loader):
    losses, steps = [], 0
    for xb, yb in loader:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                steps += 1
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(float(loss.detach().cpu()))
    return losses, steps


def main():
    accelerator = Accelerator(gradient_accumulation_steps=2)
    set_seed(0)
    assert str(accelerator.device) == "xla:0", accelerator.device
    assert accelerator.distributed_type == "XLA" and accelerator.num_processes == 1
    assert accelerator._backend.name == "xla"
    model, optimizer, loader, x = make(accelerator)
    first = [p.detach().cpu().clone() for p in model.parameters()]
    # the optimizer follows the parameters onto the device
    assert all(p.device.type == "xla" for group in optimizer.param_groups for p in group["params"])
    _, steps = epoch(accelerator, model, optimizer, loader)
    assert steps == 2, steps  # 3 batches, accumulation 2: a step after batch 2 and one at the end of the loader
    assert any(not torch.equal(a, b.detach().cpu()) for a, b in zip(first, model.parameters())), "no training"

    # every collective (one process: each returns its input, gather_object a flat list)
    t = torch.arange(4.0, device=accelerator.device)
    assert torch.equal(gather(t).cpu(), t.cpu())
    assert torch.equal(reduce(t, "sum").cpu(), t.cpu())
    assert torch.equal(broadcast(t.clone()).cpu(), t.cpu())
    assert torch.equal(pad_across_processes(t).cpu(), t.cpu())
    assert gather_object(["a", 1]) == ["a", 1]
    assert broadcast_object_list([{"k": 1}]) == [{"k": 1}]
    accelerator.wait_for_everyone()

    # gather_for_metrics over an uneven set (10 samples, batches of 4): exactly the 10 samples
    seen = torch.cat([accelerator.gather_for_metrics(xb).cpu() for xb, _ in loader])
    assert seen.shape == (10, 3), seen.shape
    assert torch.equal(seen[seen[:, 0].argsort()], x[x[:, 0].argsort()])

    # save -> two more epochs -> load -> the same two epochs again: identical
    folder = tempfile.mkdtemp()
    accelerator.save_state(folder)
    assert os.path.isfile(os.path.join(folder, "model.safetensors"))
    after = [epoch(accelerator, model, optimizer, loader)[0] for _ in range(2)]
    weights_after = [p.detach().cpu().clone() for p in model.parameters()]
    accelerator.load_state(folder)
    again = [epoch(accelerator, model, optimizer, loader)[0] for _ in range(2)]
    assert after == again, (after, again)
    assert all(torch.equal(a, b.detach().cpu()) for a, b in zip(weights_after, model.parameters()))

    # save_model: safetensors through CPU copies, readable without torch_xla
    accelerator.save_model(model, os.path.join(folder, "export"))
    saved = load_file(os.path.join(folder, "export", "model.safetensors"))
    unwrapped = accelerator.unwrap_model(model).state_dict()
    assert sorted(saved) == sorted(unwrapped)
    assert all(torch.equal(saved[k], unwrapped[k].cpu()) for k in saved)
    print("OK")


if __name__ == "__main__":
    sys.exit(main())
