"""LocalSGD on N processes: gradients stay local, parameters are averaged every k-th step and on exit.

Run through `hasten launch` (see tests/test_local_sgd.py). Prints `CHECKS-PASSED <rank> <count>`.
"""

import torch
from checks import Checks

from hasten import Accelerator
from hasten.local_sgd import LocalSGD
from hasten.utils import gather

K = 3
accelerator = Accelerator()
rank, world = accelerator.process_index, accelerator.num_processes
check = Checks(rank)


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in accelerator.unwrap_model(model).parameters()]).clone()


def per_rank(model):
    """Row r holds rank r's parameters."""
    return gather(flat_params(model)[None])


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
check(torch.equal(per_rank(model)[0], per_rank(model)[-1]), "replicas start equal")

generator = torch.Generator().manual_seed(100 + rank)  # each rank sees its own data
with LocalSGD(accelerator, model, local_sgd_steps=K) as local_sgd:
    for step in range(1, 2 * K + 3):  # 8 steps: averages after steps 3 and 6, then on exit
        x = torch.randn(16, 4, generator=generator)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        accelerator.backward(loss)
        grads = gather(torch.cat([p.grad.reshape(-1) for p in model.parameters()])[None])
        check(not torch.allclose(grads[0], grads[-1]), f"step {step}: gradients were all-reduced")
        optimizer.step()
        optimizer.zero_grad()
        before = per_rank(model)
        local_sgd.step()
        after = per_rank(model)
        if step % K == 0:
            expected = before.double().mean(dim=0)
            for r in range(world):
                check(torch.allclose(after[r].double(), expected, atol=1e-6), f"step {step}: rank {r} is not the mean")
        else:
            check(torch.equal(after, before), f"step {step}: parameters changed without an average")
            if world > 1:
                check(not torch.allclose(after[0], after[1]), f"step {step}: replicas equal between averages")
    before_exit = per_rank(model)
expected = before_exit.double().mean(dim=0)
final = per_rank(model)
for r in range(world):
    check(torch.allclose(final[r].double(), expected, atol=1e-6), f"exit: rank {r} is not the mean")
check(local_sgd.num_steps == 2 * K + 2, "step counter")

check.done()
