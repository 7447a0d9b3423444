"""Launched on 2 processes: the Accelerator with prepared data loaders (split batches, accumulation flush,
gather_for_metrics, skip_first_batches)."""

import torch
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator, DataLoaderConfiguration
from hasten.state import AcceleratorState, GradientState


def reset():
    AcceleratorState._reset_state()
    GradientState._reset_state()


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def dataset(n=64):
    g = torch.Generator().manual_seed(7)
    return TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g))


def check_split_batches_equivalence():
    """With split_batches each process gets half of every batch: same result as one process, full batches."""
    reset()
    acc = Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=True))
    model, opt = make_model(), None
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    loader = DataLoader(dataset(), batch_size=16)
    model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
    assert len(loader) == 4
    for x, y in loader:
        assert x.shape[0] == 8
        with acc.accumulate(model):
            acc.backward(torch.nn.functional.mse_loss(model(x), y))
            opt.step()
            sched.step()
            opt.zero_grad()
    reference = make_model()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=2, gamma=0.5)
    for x, y in DataLoader(dataset(), batch_size=16):
        torch.nn.functional.mse_loss(reference(x), y).backward()
        ref_opt.step()
        ref_sched.step()
        ref_opt.zero_grad()
    assert sched.get_last_lr() == ref_sched.get_last_lr()  # split batches: one scheduler step per step
    for p, q in zip(acc.unwrap_model(model).parameters(), reference.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-6)
    print("OK split_batches equivalence")


def check_accumulation_flushes_at_end_of_loader():
    reset()
    acc = Accelerator(gradient_accumulation_steps=3)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(dataset(16), batch_size=2)  # 8 batches -> 4 per process
    model, opt, loader = acc.prepare(model, opt, loader)
    seen = []
    for _ in range(2):
        for x, y in loader:
            with acc.accumulate(model):
                acc.backward(model(x).sum())
                seen.append((acc.step, acc.sync_gradients))
                opt.step()
                opt.zero_grad()
    expected = [(1, False), (2, False), (3, True), (0, True)] * 2
    assert seen == expected, seen
    print("OK accumulation flush")


def check_gather_for_metrics_and_skip():
    reset()
    acc = Accelerator()
    data = TensorDataset(torch.arange(9))
    loader = acc.prepare(DataLoader(data, batch_size=2))
    gathered = []
    for (batch,) in loader:
        gathered.append(acc.gather_for_metrics(batch))
    assert torch.cat(gathered).tolist() == list(range(9))
    objects = []
    for (batch,) in loader:
        objects += acc.gather_for_metrics(batch.tolist(), use_gather_object=True)
    assert sorted(objects) == list(range(9))
    # a tensor too goes as objects: a list of the ranks' elements (gather_object flattens one level), not a tensor
    as_objects = acc.gather_for_metrics(next(iter(loader))[0], use_gather_object=True)
    assert isinstance(as_objects, list) and [int(t) for t in as_objects] == [0, 1, 2, 3], as_objects
    skipped = acc.skip_first_batches(loader, 1)
    firsts = [b[0].tolist() for b in skipped]
    assert firsts == ([[4, 5], [8, 0]] if acc.process_index == 0 else [[6, 7], [1, 2]]), firsts
    print("OK gather_for_metrics skip_first_batches")


def check_even_batches():
    """DataLoaderConfiguration(even_batches=...): 5 samples in batches of 2 on 2 ranks. True (the default) fills
    both ranks' last step with samples from the start; False leaves rank 1 one step short and rank 0's short."""
    seen = {}
    for even in (True, False):
        reset()
        acc = Accelerator(dataloader_config=DataLoaderConfiguration(even_batches=even))
        seen[even] = [b.tolist() for (b,) in acc.prepare(DataLoader(TensorDataset(torch.arange(5)), batch_size=2))]
    if acc.process_index == 0:
        assert seen == {True: [[0, 1], [4, 0]], False: [[0, 1], [4]]}, seen
    else:
        assert seen == {True: [[2, 3], [1, 2]], False: [[2, 3]]}, seen
    print("OK even_batches")


if __name__ == "__main__":
    check_even_batches()
    check_split_batches_equivalence()
    check_accumulation_flushes_at_end_of_loader()
    check_gather_for_metrics_and_skip()
    print("ALL DONE")
