"""Launched on 2 processes: DDP training through the Accelerator behaves like one process on the full batch."""

import torch

from hasten import Accelerator, DistributedType, GradientAccumulationPlugin
from hasten.state import AcceleratorState, GradientState
from hasten.utils import gather, set_seed


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def batches(steps, size=16):
    g = torch.Generator().manual_seed(123)
    return [(torch.randn(size, 4, generator=g), torch.randn(size, 1, generator=g)) for _ in range(steps)]


def reset():
    AcceleratorState._reset_state()
    GradientState._reset_state()


def reference_weights(data, precision, accumulation=1, lrs=None):
    """One process, full batches, plain PyTorch; `lrs` gives the learning rate of each optimizer step."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    lrs = iter(lrs or [0.1] * len(data))
    for k, (x, y) in enumerate(data):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y) / accumulation
        loss.backward()
        if (k + 1) % accumulation == 0:
            opt.param_groups[0]["lr"] = next(lrs)
            opt.step()
            opt.zero_grad()
    return [p.detach() for p in model.parameters()]


def check_equivalence(precision, tolerance):
    reset()
    acc = Accelerator(mixed_precision=precision)
    assert acc.distributed_type == DistributedType.MULTI_CPU and acc.num_processes == 2
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    assert isinstance(model, torch.nn.parallel.DistributedDataParallel)
    computed = set()
    first = next(m for m in acc.unwrap_model(model).modules() if isinstance(m, torch.nn.Linear))
    first.register_forward_hook(lambda module, inputs, output: computed.add(output.dtype))
    data = batches(6)
    for x, y in data:
        x, y = x.chunk(2)[acc.process_index], y.chunk(2)[acc.process_index]
        with acc.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
    expected = reference_weights(data, precision)
    for p, q in zip(acc.unwrap_model(model).parameters(), expected):
        torch.testing.assert_close(p.detach(), q, rtol=tolerance, atol=tolerance)
    # the precision took effect: the layers computed in it (autocast), whatever the outputs are converted to
    assert computed == {torch.bfloat16 if precision == "bf16" else torch.float32}, computed
    # every rank holds the same weights
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    both = gather(flat[None])
    assert torch.equal(both[0], both[1])
    print(f"OK equivalence {precision}")


def check_no_sync_and_accumulation():
    reset()
    acc = Accelerator(gradient_accumulation_steps=2)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    model, opt, sched = acc.prepare(model, opt, sched)
    data = batches(4)
    seen = []
    for k, (x, y) in enumerate(data):
        x, y = x.chunk(2)[acc.process_index], y.chunk(2)[acc.process_index]
        with acc.accumulate(model):
            acc.backward(torch.nn.functional.mse_loss(model(x), y))
            grad = acc.unwrap_model(model)[0].weight.grad.detach().flatten()[None]
            both = gather(grad)
            same = torch.allclose(both[0], both[1], rtol=1e-6, atol=1e-7)
            seen.append((acc.step, acc.sync_gradients, same))
            opt.step()
            sched.step()
            opt.zero_grad()
    # before the sync step each rank holds only its own gradients; at the sync step they are all-reduced
    assert seen == [(1, False, False), (2, True, True), (3, False, False), (4, True, True)], seen
    # two sync steps, each stepping the scheduler num_processes (2) times: lr 0.1 * 0.5**4
    assert abs(sched.get_last_lr()[0] - 0.1 * 0.5**4) < 1e-12
    assert sched.scheduler._step_count == 5
    expected = reference_weights(data, "no", accumulation=2, lrs=[0.1, 0.1 * 0.5**2])
    for p, q in zip(acc.unwrap_model(model).parameters(), expected):
        torch.testing.assert_close(p.detach(), q, rtol=1e-5, atol=1e-6)
    print("OK no_sync accumulation scheduler")


def check_sync_each_batch():
    reset()
    acc = Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2, sync_each_batch=True))
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    x, y = batches(1)[0]
    x, y = x.chunk(2)[acc.process_index], y.chunk(2)[acc.process_index]
    with acc.accumulate(model):
        acc.backward(torch.nn.functional.mse_loss(model(x), y))
        both = gather(acc.unwrap_model(model)[0].weight.grad.flatten()[None])
        assert not acc.sync_gradients and torch.allclose(both[0], both[1])
    print("OK sync_each_batch")


def check_facade_collectives():
    acc = Accelerator()
    rank = acc.process_index
    assert acc.reduce(torch.tensor(float(rank + 1))).item() == 3.0  # the facade's default is sum
    assert acc.gather(torch.tensor([rank])).tolist() == [0, 1]
    padded = acc.pad_across_processes(torch.ones(rank + 1), pad_index=-1, pad_first=True)
    assert padded.tolist() == ([-1.0, 1.0] if rank == 0 else [1.0, 1.0])
    assert acc.on_main_process(lambda: "ran")() == ("ran" if rank == 0 else None)
    assert acc.on_process(lambda: "ran", process_index=1)() == ("ran" if rank == 1 else None)
    if rank == 1:
        acc.set_trigger()
    assert acc.check_trigger() is True and acc.check_trigger() is False
    with acc.split_between_processes({"a": [1, 2, 3], "b": [4, 5, 6]}) as share:
        assert share == ({"a": [1, 2], "b": [4, 5]} if rank == 0 else {"a": [3], "b": [6]})
    order = []
    with acc.main_process_first():
        order.append(rank)
    acc.wait_for_everyone()
    print("OK facade collectives")


class TiedModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(self.embed(tokens))


def check_comm_hook_and_tied_weights():
    from hasten import DistributedDataParallelKwargs

    reset()
    acc = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(comm_hook="fp16")])
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    data = batches(3)
    for x, y in data:
        x, y = x.chunk(2)[acc.process_index], y.chunk(2)[acc.process_index]
        acc.backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()
    # gradients travel in fp16: close to the fp32 reference, and identical on every rank
    for p, q in zip(acc.unwrap_model(model).parameters(), reference_weights(data, "no")):
        torch.testing.assert_close(p.detach(), q, rtol=1e-3, atol=1e-3)
    both = gather(torch.cat([p.detach().flatten() for p in model.parameters()])[None])
    assert torch.equal(both[0], both[1])

    tied = TiedModel()
    tied_opt = torch.optim.SGD(tied.parameters(), lr=0.1)
    tied, tied_opt = acc.prepare(tied, tied_opt)
    inner = acc.unwrap_model(tied)
    assert inner.head.weight is inner.embed.weight
    acc.backward(tied(torch.tensor([1, 2, 3])).sum())
    tied_opt.step()
    assert inner.head.weight is inner.embed.weight
    print("OK comm hook tied weights")


if __name__ == "__main__":
    check_equivalence("no", 1e-6)
    check_equivalence("bf16", 2e-2)
    check_no_sync_and_accumulation()
    check_sync_each_batch()
    check_facade_collectives()
    check_comm_hook_and_tied_weights()
    set_seed(0)
    print("ALL DONE")
