"""fp8 (torchao, float8 all-gather on) with FSDP2 cpu_ram_efficient_loading on CPU processes: rank 0 builds the model
with its weights, the others on the meta device; `prepare` swaps the fp8 layers in on both, shards, and streams rank
0's weights. Every process must then hold rank 0's weights in Float8Linear layers and train. Accelerate refuses the
combination; the Accelerator's fp8 device check is skipped (torchao's layers run on CPU with torch's CPU float8
matmul). Run by tests/training/test_fp8.py."""

import torch

import hasten.training.fp8 as fp8_support
from hasten import Accelerator
from hasten.config.fsdp import FullyShardedDataParallelPlugin

fp8_support.check_support = lambda device, backend: None  # the device check: fp8 kernels need a CUDA GPU


class Tower(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(32, 64)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.LayerNorm(64)) for _ in range(2))
        self.head = torch.nn.Linear(64, 16)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


plugin = FullyShardedDataParallelPlugin(fsdp_version=2, cpu_ram_efficient_loading=True)
accelerator = Accelerator(mixed_precision="fp8", fsdp_plugin=plugin)
torch.manual_seed(0)
reference = Tower()
if accelerator.process_index == 0:
    model = Tower()
    model.load_state_dict(reference.state_dict())
else:
    with torch.device("meta"):
        model = Tower()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
layer = model.blocks[0][0]
assert type(layer).__name__ == "Float8Linear", type(layer)
assert type(layer.weight.to_local()).__name__ == "WeightWithDynamicFloat8CastTensor", type(layer.weight.to_local())
for name, param in model.named_parameters():
    assert torch.equal(param.full_tensor(), reference.state_dict()[name]), f"{name} is not rank 0's weight"
before = layer.weight.full_tensor().clone()
for _ in range(2):
    accelerator.backward(model(torch.randn(8, 32)).pow(2).mean())
    optimizer.step()
    optimizer.zero_grad()
assert not torch.equal(before, layer.weight.full_tensor())
print(f"rank {accelerator.process_index}: fp8 layers hold rank 0's weights and train", flush=True)
