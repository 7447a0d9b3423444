"""Launched on 2 processes: what a run configures reaches the process group and the DDP module.

argv[1]: a folder for the file:// rendezvous. Prints "OK <check>" per check.
"""

import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from hasten import Accelerator, DistributedDataParallelKwargs, InitProcessGroupKwargs
from hasten.state import AcceleratorState, GradientState

rendezvous = Path(sys.argv[1]) / "rendezvous"
# InitProcessGroupKwargs(backend=, init_method=, timeout=) are handed to init_process_group ("cpu:gloo": torch's
# device-to-backend spelling, which the CPU default "gloo" is not).
accelerator = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend="cpu:gloo", init_method=f"file://{rendezvous}",
                                                                  timeout=timedelta(seconds=77))])
rank = accelerator.process_index
assert accelerator.state.backend == "cpu:gloo" and dist.get_backend() == "cpu:gloo", dist.get_backend()
assert rendezvous.exists(), "init_method file:// was not used"  # the default path uses a TCP store instead
assert dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout == timedelta(seconds=77)
print("OK InitProcessGroupKwargs", flush=True)


class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Linear(4, 8)
        self.unused = torch.nn.Linear(8, 1)  # gets no gradient
        self.head = torch.nn.Linear(8, 1)
        self.register_buffer("seen", torch.zeros(1))

    def forward(self, x):
        self.seen += 1
        return self.head(torch.tanh(self.body(x)))


def prepared(**kwargs):
    AcceleratorState._reset_state()
    GradientState._reset_state()
    acc = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(**kwargs)])
    model = acc.prepare(TwoHeads())
    assert isinstance(model, DistributedDataParallel)
    return acc, model


def step(acc, model, x):
    loss = model(x).pow(2).mean()
    acc.backward(loss)
    return loss


x = torch.randn(6, 4) + rank

# Defaults: Accelerate's, which are DDP's.
acc, model = prepared()
assert (model.dim, model.broadcast_buffers, model.find_unused_parameters, model.gradient_as_bucket_view,
        model.static_graph) == (0, True, False, False, False)
assert model.bucket_bytes_cap == 25 * 1024 * 1024 and not model._comm_hooks

# bucket_cap_mb sizes DDP's gradient buckets.
acc, model = prepared(bucket_cap_mb=1)
assert model.bucket_bytes_cap == 1024 * 1024
print("OK bucket_cap_mb", flush=True)

# dim: the dimension DDP scatters inputs along (recorded on the module).
acc, model = prepared(dim=1)
assert model.dim == 1
print("OK dim", flush=True)

# broadcast_buffers: on by default rank 0's buffers overwrite the others' at each forward.
for broadcast in (True, False):
    acc, model = prepared(broadcast_buffers=broadcast)
    assert model.broadcast_buffers is broadcast
    with torch.no_grad():
        model.module.seen.fill_(float(rank))  # rank 0: 0, rank 1: 1
        model(x)  # broadcast (rank 0's 0) then +1 -> 1 everywhere; or own value + 1
        model(x)
    seen = acc.gather(model.module.seen.clone()).tolist()
    assert seen == ([2.0, 2.0] if broadcast else [2.0, 3.0]), (broadcast, seen)
print("OK broadcast_buffers", flush=True)

# find_unused_parameters: without it a parameter that gets no gradient stops the next iteration.
acc, model = prepared(find_unused_parameters=True)
assert model.find_unused_parameters
for _ in range(2):
    step(acc, model, x)
assert model.module.unused.weight.grad is None and model.module.head.weight.grad is not None
acc, model = prepared()
step(acc, model, x)
try:
    step(acc, model, x)
except RuntimeError as error:
    assert "find_unused_parameters" in str(error) or "unused" in str(error), error
else:
    raise AssertionError("DDP without find_unused_parameters accepted a parameter with no gradient")
print("OK find_unused_parameters", flush=True)

# gradient_as_bucket_view: the gradients are views into DDP's communication buckets.
acc, model = prepared(gradient_as_bucket_view=True, find_unused_parameters=True)
assert model.gradient_as_bucket_view
step(acc, model, x)
grad = model.module.head.weight.grad
assert grad._base is not None, "gradient is not a view of a bucket"
print("OK gradient_as_bucket_view", flush=True)

# static_graph: DDP records the graph once and skips the unused-parameter search afterwards.
acc, model = prepared(static_graph=True)
assert model.static_graph
for _ in range(3):
    step(acc, model, x)  # static_graph also tolerates the unused parameter
assert model.module.head.weight.grad is not None
print("OK static_graph", flush=True)

# comm_hook / comm_wrapper / comm_state_option: the hook (and its state) DDP calls for each bucket.
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook  # noqa: E402

acc, model = prepared(comm_hook="fp16", find_unused_parameters=True)
assert [hook for hook, _ in model._comm_hooks] == [default_hooks.fp16_compress_hook]
acc, model = prepared(comm_hook="power_sgd", comm_state_option={"matrix_approximation_rank": 3,
                                                                   "start_powerSGD_iter": 5})
(hook, state), = model._comm_hooks
assert hook is powerSGD_hook.powerSGD_hook
assert isinstance(state, powerSGD_hook.PowerSGDState)
assert (state.matrix_approximation_rank, state.start_powerSGD_iter) == (3, 5)
acc, model = prepared(comm_hook="batched_power_sgd", comm_wrapper="fp16")
(hook, state), = model._comm_hooks
assert hook.__qualname__.startswith("fp16_compress_wrapper"), hook.__qualname__
assert state.matrix_approximation_rank == 1  # PowerSGD's default, as no comm_state_option was given
step(acc, model, x)  # the wrapped hook runs
print("OK comm_hook comm_wrapper comm_state_option", flush=True)

# clip_grad_norm_(norm_type=): the norm is measured with that p.
AcceleratorState._reset_state()
GradientState._reset_state()
acc = Accelerator()
model = acc.prepare(torch.nn.Linear(3, 1, bias=False))
model.module.weight.grad = torch.tensor([[3.0, -4.0, 1.0]])
total_inf = acc.clip_grad_norm_(model.parameters(), max_norm=100.0, norm_type=float("inf"))
total_1 = acc.clip_grad_norm_(model.parameters(), max_norm=100.0, norm_type=1)
total_2 = acc.clip_grad_norm_(model.parameters(), max_norm=100.0)
assert (float(total_inf), float(total_1)) == (4.0, 8.0) and abs(float(total_2) - 26 ** 0.5) < 1e-6
print("OK clip_grad_norm_ norm_type", flush=True)

# gather_for_metrics(input_data): every rank's tensors, nested structures and objects come back in rank order.
gathered = acc.gather_for_metrics({"logits": torch.full((2, 3), float(rank)), "ids": torch.tensor([rank])})
assert gathered["logits"].shape == (4, 3) and gathered["ids"].tolist() == [0, 1]
assert acc.gather_for_metrics(input_data=[f"rank{rank}"], use_gather_object=True) == ["rank0", "rank1"]
print("OK gather_for_metrics input_data", flush=True)
print("ALL DONE", flush=True)
