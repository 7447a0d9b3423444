"""hasten demo: a small MLP learns y = sin(x0) + x1 * x2 on synthetic data.

Run it on 2 CPU processes:  hasten launch --num_processes 2 examples/demo.py
The same file runs unchanged on 1 process, one GPU or many GPUs.
"""

import torch
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator
from hasten.utils import set_seed


def make_data(n=4096):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=g)
    y = torch.sin(x[:, :1]) + x[:, 1:2] * x[:, 2:3]
    return TensorDataset(x, y)


def main():
    accelerator = Accelerator(gradient_accumulation_steps=2)
    set_seed(42)
    model = torch.nn.Sequential(torch.nn.Linear(3, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = DataLoader(make_data(), batch_size=32, shuffle=True)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.7)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    accelerator.print(f"{accelerator.num_processes} processes, {accelerator.distributed_type}, device {accelerator.device}")
    for epoch in range(6):
        model.train()
        total = torch.zeros((), device=accelerator.device)
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            total += loss.detach()
        mean_loss = accelerator.reduce(total / len(loader), reduction="mean")
        accelerator.print(f"epoch {epoch}: loss {mean_loss.item():.4f}  lr {scheduler.get_last_lr()[0]:.5f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
