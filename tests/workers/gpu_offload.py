"""FSDP2 with cpu_ram_efficient_loading (+ cpu_offload on a GPU, issue 22 item 4 and issue 30 item 7): a model
with a persistent buffer (BatchNorm) is built on rank 0 only, the others on the meta device; after prepare() the
shards live in CPU memory and the buffers on the GPU, the weights are rank 0's, and a step runs. On CPU (the twin)
there is nothing to offload to, so cpu_offload is off there and only the device placement checks are skipped.
Run by tests/gpu/test_offload_and_io_gpu.py."""

import torch
from gpu_common import ON_GPU, device_only

from hasten import Accelerator
from hasten.config.fsdp import FullyShardedDataParallelPlugin


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 16)
        self.norm = torch.nn.BatchNorm1d(16)
        self.b = torch.nn.Linear(16, 1)

    def forward(self, x):
        return self.b(self.norm(self.a(x)))


plugin = FullyShardedDataParallelPlugin(fsdp_version=2, cpu_ram_efficient_loading=True, cpu_offload=ON_GPU)
acc = Accelerator(fsdp_plugin=plugin)
torch.manual_seed(0)
reference = Net()
with torch.no_grad():
    reference.norm.running_mean.fill_(0.25)  # a buffer value the meta ranks can only get from rank 0
if acc.process_index == 0:
    model = Net()
    model.load_state_dict(reference.state_dict())
else:
    with torch.device("meta"):
        model = Net()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, optimizer = acc.prepare(model, optimizer)
device_only("the parameter shards are in CPU memory", "no device to offload from",
            lambda: all(p.to_local().device.type == "cpu" for p in model.parameters()))
device_only("the buffers are on the GPU", "no GPU", lambda: all(b.device.type == "cuda" for b in model.buffers()))
assert torch.equal(model.norm.running_mean.cpu(), reference.norm.running_mean), model.norm.running_mean
whole = acc.get_state_dict(model)
if acc.process_index == 0:
    expected = reference.state_dict()
    assert whole.keys() == expected.keys(), (whole.keys(), expected.keys())
    assert all(torch.equal(whole[k].cpu(), v) for k, v in expected.items())
loss = model(torch.randn(4, 16, device=acc.device)).pow(2).mean()
acc.backward(loss)
acc.clip_grad_norm_(model.parameters(), 1.0)  # item 8: CPU-offloaded gradients' norm, over NCCL+gloo on a GPU
optimizer.step()
print(f"rank {acc.process_index}: offload checks passed", flush=True)
