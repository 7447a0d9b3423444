"""DeepSpeed checkpoints across launches (run by tests/backends/test_deepspeed.py):

    deepspeed_resume.py WORKDIR train    6 steps, save_state after step 3 (checkpoint_0); write the expected rest
    deepspeed_resume.py WORKDIR crash    load checkpoint_0, 1 step, save checkpoint_1 (the caller SIGKILLs it midway)
    deepspeed_resume.py WORKDIR resume   load the newest whole checkpoint (must be checkpoint_0), steps 4-6: the
                                         losses and weights must equal the uninterrupted run's bit for bit
For ZeRO-2 (fp32) and ZeRO-3 (bf16), with dropout so that the restored random state matters.
"""

import os
import sys

import torch
from deepspeed_common import LR, dataset, loader, loss_of, make_model, reset_state

from hasten import Accelerator, DataLoaderConfiguration, DeepSpeedPlugin, ProjectConfiguration
from hasten.distributed.rng import set_seed

RUNS = {"zero2_fp32": (2, "no"), "zero3_bf16": (3, "bf16")}
TOTAL, SAVE_AT = 6, 3


def setup(workdir, name):
    stage, precision = RUNS[name]
    reset_state()
    project = ProjectConfiguration(project_dir=os.path.join(workdir, name), automatic_checkpoint_naming=True)
    # load_state moves the loader to its saved position with Accelerate's switch (the run resumes mid-epoch).
    accelerator = Accelerator(mixed_precision=precision, project_config=project,
                              deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage, gradient_clipping=1.0),
                              dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
    set_seed(0)
    model = make_model(dropout=0.2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    model, optimizer, data, scheduler = accelerator.prepare(model, optimizer, loader(), scheduler)
    return accelerator, model, optimizer, data, scheduler


def steps(accelerator, model, optimizer, batches, scheduler, count):
    losses = []
    for _ in range(count):
        x, y = next(batches)
        loss = loss_of(model, x, y)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def run(workdir, phase):
    for name in RUNS:
        accelerator, model, optimizer, data, scheduler = setup(workdir, name)
        expected_path = os.path.join(workdir, f"{name}_expected_{accelerator.process_index}.pt")
        if phase == "train":
            batches = iter(data)
            steps(accelerator, model, optimizer, batches, scheduler, SAVE_AT)
            accelerator.save_state()  # mid-epoch: the loader's position is saved too
            rest = steps(accelerator, model, optimizer, batches, scheduler, TOTAL - SAVE_AT)
            torch.save({"losses": rest, "state": accelerator.get_state_dict(model)}, expected_path)
        elif phase == "crash":
            accelerator.load_state()
            steps(accelerator, model, optimizer, iter(data), scheduler, 1)
            accelerator.save_state()  # killed in here by HASTEN_TEST_CRASH_AT
            raise AssertionError("the save was meant to be killed")
        else:
            root = os.path.join(workdir, name, "checkpoints")
            # The killed save left at most a hidden temporary folder, never a checkpoint_1.
            assert [n for n in sorted(os.listdir(root)) if not n.startswith(".")] == ["checkpoint_0"], os.listdir(root)
            accelerator.load_state()
            assert accelerator.save_iteration == 1
            rest = steps(accelerator, model, optimizer, iter(data), scheduler, TOTAL - SAVE_AT)  # resumes at batch 3
            expected = torch.load(expected_path)
            assert rest == expected["losses"], f"{name}: losses {rest} != uninterrupted {expected['losses']}"
            state = accelerator.get_state_dict(model)
            if state is not None or expected["state"] is not None:
                for key, value in expected["state"].items():
                    assert torch.equal(state[key], value), f"{name}: {key} differs from the uninterrupted run"
            print(f"OK resume {name}", flush=True)
    assert len(dataset()) >= TOTAL * 8


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2])
