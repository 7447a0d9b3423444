"""A small training run that can stop after any micro-step and resume from its checkpoint.

Run directly or through `hasten launch`, one run per argument, in order:
    ckpt_train.py WORKDIR:STEPS:STOP_AFTER:RESUME:ACCUM:LOADER ...
(STOP_AFTER 0 = never; RESUME 0/1; LOADER manual|prepared|skip|skipfirst|continue):
  manual     indexes the data itself;
  prepared   iterates the prepared loader again after load_state (use_stateful_dataloader=True: it resumes);
  skip       load_state, then skip_first_batches(loader, k), with use_seedable_sampler (Accelerate's idiom);
  skipfirst  the same without use_seedable_sampler (diffusers' scripts);
  continue   iterates the loader from the start and `continue`s past the first k batches (diffusers' other idiom). It writes the final weights to WORKDIR/final_<rank>.pt (when it runs to the end).
Dropout, shuffled data, AdamW and an LR schedule make every piece of state matter for an exact resume.
"""

from __future__ import annotations

import argparse
import os

import torch

from hasten import Accelerator, DataLoaderConfiguration, ProjectConfiguration
from hasten.distributed.rng import set_seed
from hasten.state import GradientState


class Progress:
    """Where the run is: registered for checkpointing, so it comes back with load_state."""

    def __init__(self):
        self.epoch, self.batch, self.micro = 0, 0, 0

    def state_dict(self):
        return {"epoch": self.epoch, "batch": self.batch, "micro": self.micro}

    def load_state_dict(self, state):
        self.epoch, self.batch, self.micro = state["epoch"], state["batch"], state["micro"]


def dataset(n: int = 48):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 6, generator=g)
    y = (x @ torch.randn(6, 1, generator=g)).squeeze(1) + 0.1 * torch.randn(n, generator=g)
    return torch.utils.data.TensorDataset(x, y)


def run(workdir: str, steps: int, stop_after=None, resume: bool = False, accum: int = 1, loader: str = "manual",
        batch_size: int = 4):
    os.makedirs(workdir, exist_ok=True)
    GradientState._reset_state()  # several runs may share one process; each starts at micro-step 0
    set_seed(7)
    accelerator = Accelerator(
        gradient_accumulation_steps=accum,
        project_config=ProjectConfiguration(project_dir=workdir, automatic_checkpoint_naming=True, total_limit=2),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=loader == "skip",
                                                   use_stateful_dataloader=loader == "prepared"),
    )
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    data = dataset()
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    if loader == "manual":
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
        batches_per_epoch = len(data) // (batch_size * accelerator.num_processes)
    else:
        dl = torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=True)
        model, optimizer, dl, scheduler = accelerator.prepare(model, optimizer, dl, scheduler)
        batches_per_epoch = len(dl)
    if resume:
        accelerator.load_state()

    def micro_step(x, y):
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        progress.micro += 1
        progress.batch += 1
        return stop_after is not None and progress.micro == stop_after

    while progress.micro < steps:
        if loader == "manual":
            # Shuffle from the epoch number: the data order is then independent of the global RNG.
            order = torch.randperm(len(data), generator=torch.Generator().manual_seed(100 + progress.epoch))
            start = progress.batch
            for b in range(start, batches_per_epoch):
                first = (b * accelerator.num_processes + accelerator.process_index) * batch_size
                x, y = data[order[first:first + batch_size]]
                if micro_step(x, y):
                    return accelerator, accelerator.save_state()
                if progress.micro >= steps:
                    break
        else:
            iterable, resume_step = dl, 0
            if loader in ("skip", "skipfirst") and progress.batch:
                iterable = accelerator.skip_first_batches(dl, progress.batch)
            elif loader == "continue":
                resume_step = progress.batch
            for step, (x, y) in enumerate(iterable):
                if step < resume_step:
                    continue
                if micro_step(x, y):
                    return accelerator, accelerator.save_state()
                if progress.micro >= steps:
                    break
        if progress.batch >= batches_per_epoch:
            progress.epoch, progress.batch = progress.epoch + 1, 0
    unwrapped = accelerator.unwrap_model(model)
    torch.save({k: v.detach().cpu() for k, v in unwrapped.state_dict().items()},
               os.path.join(workdir, f"final_{accelerator.process_index}.pt"))
    return accelerator, None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("jobs", nargs="+")
    accelerator = None
    for job in parser.parse_args().jobs:
        workdir, steps, stop_after, resume, accum, loader = job.split(":")
        accelerator, _ = run(workdir, int(steps), int(stop_after) or None, resume == "1", int(accum), loader)
    accelerator.end_training()


if __name__ == "__main__":
    main()
