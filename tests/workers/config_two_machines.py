"""Two `hasten launch` commands, one per "machine", train one model together; each prints the final weights."""

import json
import os

import torch

from hasten.accelerator import Accelerator
from hasten.distributed.operations import gather

accelerator = Accelerator()
world, rank = accelerator.num_processes, accelerator.process_index
assert world == 2, f"expected 2 processes over the two machines, got {world}"

torch.manual_seed(0)
model = torch.nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)

# Each rank sees different data; only gradient averaging across machines keeps the weights equal.
generator = torch.Generator().manual_seed(100 + rank)
for _ in range(5):
    x = torch.randn(8, 3, generator=generator)
    y = x.sum(dim=1, keepdim=True) * (rank + 1)
    loss = torch.nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()

weights = torch.cat([p.detach().reshape(-1) for p in accelerator.unwrap_model(model).parameters()])
everyone = gather(weights.unsqueeze(0))
assert torch.equal(everyone[0], everyone[1]), f"weights differ across machines: {everyone.tolist()}"
print("WEIGHTS " + json.dumps([round(v, 6) for v in weights.tolist()]), "RANK", rank,
      "GROUP_RANK", os.environ.get("GROUP_RANK"), flush=True)
