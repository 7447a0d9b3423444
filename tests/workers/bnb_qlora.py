"""QLoRA on N processes (DDP over gloo): a 4-bit frozen base loaded on every rank, trainable low-rank adapters.

Run through `hasten launch` (see tests/big_model/test_bnb.py). Prints `CHECKS-PASSED <rank> <count>`.
"""

import sys

import torch
from checks import Checks
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hasten import Accelerator, init_empty_weights
from hasten.utils import gather
from hasten.utils.bnb import BnbQuantizationConfig, load_and_quantize_model

accelerator = Accelerator()
rank = accelerator.process_index
check = Checks(rank)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 32)
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        return self.head(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class LoRA(nn.Module):
    def __init__(self, base, rank=4):
        super().__init__()
        self.base = base
        self.a = nn.Parameter(torch.randn(base.in_features, rank, generator=torch.Generator().manual_seed(1)) * 0.1)
        self.b = nn.Parameter(torch.zeros(rank, base.out_features))

    def forward(self, x):
        return self.base(x) + x @ self.a @ self.b


config = BnbQuantizationConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype="fp32")
with init_empty_weights():
    model = Net()
model = load_and_quantize_model(model, config, weights_location=sys.argv[1])
model.requires_grad_(False)
model.fc1, model.fc2 = LoRA(model.fc1), LoRA(model.fc2)
frozen = {k: v.clone() for k, v in model.state_dict().items() if not k.endswith((".a", ".b"))}
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
model, optimizer = accelerator.prepare(model, optimizer)
check(isinstance(model, DistributedDataParallel), "the model with trainable adapters is wrapped in DDP")
check([n for n, p in model.named_parameters() if p.requires_grad]
      == ["module.fc1.a", "module.fc1.b", "module.fc2.a", "module.fc2.b"], "only the adapters train")

generator = torch.Generator().manual_seed(10 + rank)  # each rank its own batch, seen at every step
x = torch.randn(16, 32, generator=generator)
y = torch.randn(16, 1, generator=generator)
losses = []
for step in range(15):
    loss = nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    grads = gather(torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.requires_grad])[None])
    check(torch.allclose(grads[0], grads[-1]), f"step {step}: adapter gradients are all-reduced")
    optimizer.step()
    optimizer.zero_grad()
    losses.append(accelerator.reduce(loss.detach(), "mean").item())
check(sum(losses[-3:]) < 0.8 * sum(losses[:3]), f"the loss goes down: {losses}")
after = accelerator.unwrap_model(model).state_dict()
check(all(torch.equal(frozen[k], after[k]) for k in frozen), "the 4-bit base is unchanged")
adapters = gather(torch.cat([p.detach().reshape(-1) for p in model.parameters() if p.requires_grad])[None])
check(torch.equal(adapters[0], adapters[-1]), "adapters are equal on every rank")
check.done()
