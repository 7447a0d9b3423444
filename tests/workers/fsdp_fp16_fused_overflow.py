"""Issue 30, item 9: FSDP1 + fp16 + a fused AdamW, no clipping, an overflow on rank 0 only. Every rank must skip
the step (and lower the scale) together; a rank that steps while another skips leaves the shards of one model
from two different steps. Run by tests/test_optimizer.py (2 CPU processes, gloo)."""

import torch

from hasten import Accelerator
from hasten.config.fsdp import FullyShardedDataParallelPlugin
from hasten.utils import GradScalerKwargs

acc = Accelerator(mixed_precision="fp16", fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=1),
                  kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
assert optimizer._step_supports_amp_scaling
model, optimizer = acc.prepare(model, optimizer)
rank = acc.process_index
before = [p.detach().clone() for p in model.parameters()]
loss = model(torch.randn(4, 8)).float().pow(2).mean()
acc.backward(loss)
# The overflow in rank 0's shard only: an inf in the loss would reach every shard through the reduce-scatter.
if rank == 0:
    with torch.no_grad():
        next(p for p in model.parameters() if p.grad is not None and p.grad.numel()).grad.view(-1)[0] = float("inf")
optimizer.step()
optimizer.zero_grad()
unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
report = (acc.optimizer_step_was_skipped, unchanged, acc.scaler.get_scale())
every = acc.gather_for_metrics([report], use_gather_object=True)
print(f"rank {rank}: {report} all {every}", flush=True)
assert all(r == (True, True, 512.0) for r in every), every
print(f"rank {rank}: overflow skipped on every rank", flush=True)
# Then a clipped step (clipping unscales first): the fused kernel got ShardedGradScaler's [1]-shaped flag and failed.
acc.backward(model(torch.randn(4, 8)).float().pow(2).mean())
acc.clip_grad_norm_(model.parameters(), 1.0)
optimizer.step()
assert not acc.optimizer_step_was_skipped and any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
print(f"rank {rank}: clipped fused step taken", flush=True)
