"""Gradient synchronisation: `no_sync` keeps each rank's gradients local, a plain backward averages them, and
`accumulate` syncs on every `gradient_accumulation_steps`-th batch and on the last batch of the loader, with
the gradients a full-batch step would give. Run it in every process of a launch (one process is a no-op check)."""

from __future__ import annotations

import copy


def _flat_grads(model):
    import torch

    return torch.cat([p.grad.detach().reshape(-1) for p in model.parameters()])


def _same_on_every_rank(accelerator, tensor) -> bool:
    import torch

    everyone = accelerator.gather(tensor.unsqueeze(0))
    return bool(torch.allclose(everyone, everyone[0].expand_as(everyone)))


def _fail(what: str, rank: int, got) -> None:
    raise AssertionError(f"test_sync: {what} on rank {rank}: {got}")


def check_no_sync(accelerator) -> None:
    import torch

    from hasten.test_utils.training import RegressionModel

    rank, world = accelerator.process_index, accelerator.num_processes
    torch.manual_seed(0)
    model = accelerator.prepare(RegressionModel(a=1, b=1))
    x = torch.tensor([float(rank + 1)], device=accelerator.device)
    with accelerator.no_sync(model):
        accelerator.backward(model(x).sum())
    local = _flat_grads(model).clone()
    if not torch.allclose(local.cpu(), torch.tensor([float(rank + 1), 1.0])):
        _fail("gradients inside no_sync are not this rank's own", rank, local.tolist())
    if world > 1 and _same_on_every_rank(accelerator, local):
        _fail("gradients synchronised inside no_sync", rank, local.tolist())
    model.zero_grad()
    accelerator.backward(model(x).sum())
    synced = _flat_grads(model)
    if not torch.allclose(synced.cpu(), torch.tensor([(world + 1) / 2, 1.0])):
        _fail("a plain backward did not average the gradients over ranks", rank, synced.tolist())


def check_accumulate(accelerator, batches: int = 5) -> None:
    import torch
    from torch.utils.data import DataLoader

    from hasten.test_utils.training import RegressionModel

    rank, world, steps = accelerator.process_index, accelerator.num_processes, accelerator.gradient_accumulation_steps
    data = torch.arange(1, batches * world + 1, dtype=torch.float32)
    torch.manual_seed(0)
    reference = RegressionModel(a=1, b=1)
    model = accelerator.prepare(copy.deepcopy(reference))
    loader = accelerator.prepare(DataLoader(data, batch_size=1))
    group: list = []  # global samples of the current accumulation window
    for index, batch in enumerate(loader):
        with accelerator.accumulate(model):
            # backward() divides the loss by gradient_accumulation_steps itself.
            accelerator.backward(model(batch.to(accelerator.device)).sum())
            group += accelerator.gather(batch.to(accelerator.device)).tolist()
            last = index == len(loader) - 1
            if accelerator.sync_gradients != ((index + 1) % steps == 0 or last):
                _fail(f"sync_gradients is {accelerator.sync_gradients} at batch {index}", rank, "wrong step")
            grads = _flat_grads(model).clone()
            if accelerator.sync_gradients:
                # The reference sees the window's global samples in one backward: mean over ranks, sum over steps.
                reference.zero_grad()
                (reference(torch.tensor(group)).sum() / (steps * world)).backward()
                if not torch.allclose(grads.cpu(), _flat_grads(reference), atol=1e-6):
                    _fail(f"accumulated gradients at batch {index} differ from one full-batch step",
                          rank, (grads.tolist(), _flat_grads(reference).tolist()))
                model.zero_grad()
                group = []
            elif world > 1 and _same_on_every_rank(accelerator, grads):
                _fail(f"gradients synchronised at batch {index}, inside an accumulation window", rank, grads.tolist())


def main() -> None:
    from hasten.accelerator import Accelerator
    from hasten.state import GradientState

    accelerator = Accelerator()
    check_no_sync(accelerator)
    GradientState._reset_state()
    accelerator = Accelerator(gradient_accumulation_steps=2)
    check_accumulate(accelerator)
    accelerator.wait_for_everyone()
    accelerator.print(f"test_sync: gradient synchronisation is right on {accelerator.num_processes} process(es)")


if __name__ == "__main__":
    main()
