"""FSDP2 with cpu_ram_efficient_loading and cpu_offload on CUDA (issue 22, item 4): the shards live in CPU
memory, buffers on the GPU, the weights are rank 0's, and a step runs. Run by tests/gpu/test_offload_and_io_gpu.py."""

import torch

from hasten import Accelerator
from hasten.backends.fsdp.plugin import FullyShardedDataParallelPlugin


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 16)
        self.norm = torch.nn.BatchNorm1d(16)
        self.b = torch.nn.Linear(16, 1)

    def forward(self, x):
        return self.b(self.norm(self.a(x)))


plugin = FullyShardedDataParallelPlugin(fsdp_version=2, cpu_ram_efficient_loading=True, cpu_offload=True)
acc = Accelerator(fsdp_plugin=plugin)
torch.manual_seed(0)
reference = Net()
if acc.process_index == 0:
    model = Net()
    model.load_state_dict(reference.state_dict())
else:
    with torch.device("meta"):
        model = Net()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model, optimizer = acc.prepare(model, optimizer)
assert all(p.to_local().device.type == "cpu" for p in model.parameters()), [p.device for p in model.parameters()]
assert all(b.device.type == "cuda" for b in model.buffers()), [b.device for b in model.buffers()]
whole = acc.get_state_dict(model)
if acc.process_index == 0:
    assert all(torch.equal(whole[k].cpu(), v) for k, v in reference.state_dict().items() if k in whole)
loss = model(torch.randn(4, 16, device=acc.device)).pow(2).mean()
acc.backward(loss)
optimizer.step()
print(f"rank {acc.process_index}: offload checks passed", flush=True)
