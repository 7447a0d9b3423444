"""A run that is killed, preempted or left alone, and resumes by itself (issue 17, tests/resilience/test_auto_resume.py and
tests/resilience/test_preemption.py).

    resume_train.py WORKDIR RESUME EVENT
RESUME: `flag` (ProjectConfiguration(automatic_resume=True), no resume code at all) or `call`
(`accelerator.load_state()` after prepare, plus handle_preemption=True and use_stateful_dataloader=True, which
an explicit load_state needs to move the loader, as in Accelerate).
EVENT, on the first attempt only (TORCHELASTIC_RESTART_COUNT 0 or unset), at micro-step S of rank R:
  none          run to the end
  kill:R:S      SIGKILL after micro-step S
  save:R:S:N    SIGKILL at the N-th crash point of the save after micro-step S (a kill in the middle of a save)
  usr1:R:S      SIGUSR1 to itself inside micro-step S (one rank only)
  wait:S        inside micro-step S, rank 0 prints READY and every rank waits until a preemption signal arrives
It saves every 3 micro-steps (automatic naming, total_limit=2) and at the end writes WORKDIR/final.pt: the
weights, the step counter and the checkpoint iteration. Dropout, shuffled data, AdamW, an LR schedule and
gradient accumulation make every piece of state matter for a bit-identical finish.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch

from hasten import Accelerator, DataLoaderConfiguration, ProjectConfiguration
from hasten.resilience import preemption
from hasten.distributed.rng import set_seed

EPOCHS, SAVE_EVERY = 3, 3


class Progress:
    def __init__(self):
        self.epoch, self.micro = 0, 0

    def state_dict(self):
        return {"epoch": self.epoch, "micro": self.micro}

    def load_state_dict(self, state):
        self.epoch, self.micro = state["epoch"], state["micro"]


def main(workdir: str, resume: str, event: str) -> None:
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    kind, *numbers = event.split(":")
    numbers = [int(n) for n in numbers]
    set_seed(11)
    accelerator = Accelerator(
        gradient_accumulation_steps=2,
        project_config=ProjectConfiguration(project_dir=workdir, automatic_checkpoint_naming=True, total_limit=2,
                                            automatic_resume=resume == "flag", handle_preemption=True),
        # An explicit load_state() moves the loader to its saved position only with Accelerate's switch.
        dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=resume == "call"),
    )
    rank = accelerator.process_index
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(64, 6, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True) + 0.1 * torch.randn(64, 1, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
    # Two prepare calls and a registration after them: the automatic resume waits for all three.
    model, optimizer = accelerator.prepare(model, optimizer)
    loader, scheduler = accelerator.prepare(loader, scheduler)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    if resume == "call" and os.path.isdir(os.path.join(workdir, "checkpoints")):
        accelerator.load_state()  # as an Accelerate script resumes: once a checkpoint was saved
    print(f"START rank={rank} attempt={os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')} micro={progress.micro} "
          f"iteration={accelerator.save_iteration}", flush=True)

    def at(step_kind, expected_numbers):
        return first_attempt and kind == step_kind and rank == expected_numbers[0] and progress.micro == expected_numbers[1]

    try:
        while progress.epoch < EPOCHS:
            for inputs, targets in loader:
                with accelerator.accumulate(model):
                    loss = torch.nn.functional.mse_loss(model(inputs), targets)
                    accelerator.backward(loss)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad()
                    progress.micro += 1
                    if at("usr1", numbers):
                        os.kill(os.getpid(), signal.SIGUSR1)
                    if kind == "wait" and first_attempt and progress.micro == numbers[0]:
                        if rank == 0:
                            print("READY", flush=True)
                        deadline = time.monotonic() + 120
                        while not preemption.requested() and time.monotonic() < deadline:
                            time.sleep(0.05)
                if at("kill", numbers):
                    os.kill(os.getpid(), signal.SIGKILL)
                if progress.micro % SAVE_EVERY == 0:
                    if at("save", numbers):
                        os.environ["HASTEN_TEST_CRASH_AT"] = str(numbers[2])
                    accelerator.save_state()
            progress.epoch += 1
    except SystemExit:
        print(f"STOPPED rank={rank} micro={progress.micro} step={accelerator.step}", flush=True)
        raise
    if rank == 0:
        state = {k: v.detach().clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}
        torch.save({"weights": state, "step": accelerator.step, "iteration": accelerator.save_iteration,
                    "micro": progress.micro}, os.path.join(workdir, "final.pt"))
    print(f"DONE rank={rank} micro={progress.micro}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
