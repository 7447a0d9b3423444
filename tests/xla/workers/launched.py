"""A script written for `accelerate launch --tpu`: everything happens in `main()`, which the launcher calls in
every replica. Prints `LAUNCHED <process index> <num_processes> <samples gathered>`."""

import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator


def main():
    accelerator = Accelerator()
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(10, 3, generator=generator)
    model = torch.nn.Linear(3, 1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(TensorDataset(x), batch_size=2))
    count = 0
    for (xb,) in loader:
        accelerator.backward(model(xb).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
        count += accelerator.gather_for_metrics(xb).shape[0]
    assert sys.argv[1:] == ["--flag", "value"], sys.argv
    print(f"LAUNCHED {accelerator.process_index} {accelerator.num_processes} {count}", flush=True)


if __name__ == "__main__":
    raise SystemExit("run me with `hasten launch --tpu` (it calls main())")
