"""Checkpoints in object storage across launches (run by tests/checkpoint/test_remote_checkpoints.py).

    remote_resume.py URL WORKDIR LAYOUT PHASES
URL: the project_dir, an s3:// prefix on the tests' S3 server (credentials and endpoint in the environment).
LAYOUT: ddp | fsdp2 (SHARDED_STATE_DICT: every rank uploads its DCP shards) | zero2 (DeepSpeed) | tp (tp_size=2).
PHASES: one or more of these, joined by "+", run one after the other in the same processes:
  full    STEPS steps, no checkpoint; rank 0 writes WORKDIR/full.pt (the whole weights)
  part    SAVED steps, save_state after each (automatic naming, total_limit=2; the last one asynchronous), then exit
  resume  ProjectConfiguration(automatic_resume=True): loads the newest committed checkpoint from the bucket by
          itself, runs to STEPS; rank 0 writes WORKDIR/resume.pt (must equal `full` bit for bit), then saves once more
          (the new launch takes over the root's claim from the run it continues).
Dropout and a shuffled loader make the random states and the loader position matter.
"""

import os
import sys

import torch

from hasten import Accelerator, ParallelismConfig, ProjectConfiguration
from hasten.distributed.rng import set_seed

STEPS, SAVED = 6, 3


class Progress:
    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, state):
        self.step = state["step"]


def build(layout: str, project):
    kwargs = {}
    if layout == "zero2":
        from hasten import DeepSpeedPlugin

        kwargs["deepspeed_plugin"] = DeepSpeedPlugin(zero_stage=2, gradient_clipping=1.0)
    if layout == "tp":
        kwargs["parallelism_config"] = ParallelismConfig(tp_size=2)
    accelerator = Accelerator(project_config=project, **kwargs)
    set_seed(0)
    g = torch.Generator().manual_seed(7)
    if layout == "tp":
        from tp_common import GLOBAL_BATCH, make_model, tokens

        model = make_model(seed=1)
        data = torch.utils.data.TensorDataset(torch.cat([tokens(s)[:GLOBAL_BATCH] for s in range(STEPS)]))

        def loss_of(model, batch):
            (ids,) = batch
            logits = model(ids[:, :-1])
            return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))
    else:
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1))
        x = torch.randn(96, 8, generator=g)
        data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True).sin())

        def loss_of(model, batch):
            inputs, targets = batch
            return torch.nn.functional.mse_loss(model(inputs).float(), targets)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    return accelerator, model, optimizer, loader, loss_of


def weights(accelerator, model) -> dict:
    state = accelerator.get_state_dict(model)
    return {k: v.detach().float().clone() for k, v in (state or {}).items()}


def main(url: str, workdir: str, layout: str, phases: str) -> None:
    for phase in phases.split("+"):
        run(url, workdir, layout, phase)


def run(url: str, workdir: str, layout: str, phase: str) -> None:
    from hasten.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)  # phases run one after the other in these processes
    GradientState._reset_state()
    project = ProjectConfiguration(project_dir=url, automatic_checkpoint_naming=True, total_limit=2,
                                   automatic_resume=phase == "resume")
    accelerator, model, optimizer, loader, loss_of = build(layout, project)
    progress = Progress()

    def report(models, folder):  # what the fetched copy of the checkpoint holds on this machine's disk
        local = sum(name.endswith(".distcp") for _, _, names in os.walk(folder) for name in names)
        print(f"FETCHED rank={accelerator.process_index} shard_files_on_disk={local}", flush=True)

    accelerator.register_load_state_pre_hook(report)
    accelerator.register_for_checkpointing(progress)  # automatic_resume loads here, once everything is held
    print(f"START rank={accelerator.process_index} step={progress.step} iteration={accelerator.save_iteration}",
          flush=True)
    last = SAVED if phase == "part" else STEPS
    while progress.step < last:
        for batch in loader:
            if progress.step >= last:
                break
            loss = loss_of(model, batch)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            progress.step += 1
            if phase == "part":
                accelerator.save_state(async_save=progress.step == SAVED and layout in ("ddp", "fsdp2"))
    accelerator.wait_for_checkpoint()
    state = weights(accelerator, model)
    if phase == "resume":  # a relaunched job saves where the job it continues saved (it takes the root's claim)
        accelerator.save_state()
    if phase != "part" and accelerator.is_main_process:
        torch.save(state, os.path.join(workdir, f"{phase}.pt"))
    accelerator.wait_for_everyone()
    print(f"DONE rank={accelerator.process_index} phase={phase} step={progress.step}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
