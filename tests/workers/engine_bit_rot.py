"""Bit rot in files a library wrote itself (run by tests/checkpoint/test_engine_checksums.py).

    engine_bit_rot.py ROOT LAYOUT MODE
LAYOUT: fsdp2 (SHARDED_STATE_DICT: torch's DCP writes the shards) | zero2 (DeepSpeed writes its folder).
MODE:
  save    two steps, save_state after each (automatic naming under ROOT); rank 0 prints the marker's checksummed files
  load    load_state(ROOT/checkpoints/checkpoint_1): prints "REFUSED <rank>: <message>" or "LOADED <rank>"
  resume  ProjectConfiguration(automatic_resume=True): prints "RESUMED <rank> <step>" with the restored step
"""

import json
import os
import sys

import torch

from hasten import Accelerator, ProjectConfiguration
from hasten.core.errors import ChecksumError


class Step:
    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, state):
        self.step = state["step"]


def say(line: str) -> None:
    """One write per line: the two processes share the launcher's output (print writes the newline apart)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(root: str, layout: str, mode: str) -> None:
    kwargs = {}
    if layout == "fsdp2":
        from hasten.utils import FullyShardedDataParallelPlugin

        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
    else:
        from hasten import DeepSpeedPlugin

        kwargs["deepspeed_plugin"] = DeepSpeedPlugin(zero_stage=2)
    project = ProjectConfiguration(project_dir=root, automatic_checkpoint_naming=True,
                                   automatic_resume=mode == "resume")
    accelerator = Accelerator(project_config=project, **kwargs)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.utils.data.TensorDataset(torch.randn(16, 16), torch.randn(16, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    step = Step()
    accelerator.register_for_checkpointing(step)  # automatic_resume loads here, once everything is held
    rank = accelerator.process_index
    if mode == "save":
        for inputs, targets in loader:
            accelerator.backward(torch.nn.functional.mse_loss(model(inputs), targets))
            optimizer.step()
            optimizer.zero_grad()
            step.step += 1
            folder = accelerator.save_state()
            if step.step == 2:
                break
        if rank == 0:
            with open(os.path.join(folder, "hasten_checkpoint.json")) as handle:
                marker = json.load(handle)
            print("PASS_FILES", json.dumps(sorted(n for n, s in marker["checksums"].items() if s.get("pass"))))
            print("ALL_FILES", json.dumps(sorted(marker["files"])))
    elif mode == "load":
        try:
            accelerator.load_state(os.path.join(root, "checkpoints", "checkpoint_1"))
        except ChecksumError as error:
            say(f"REFUSED {rank}: {error}")
        else:
            say(f"LOADED {rank}")
    else:
        say(f"RESUMED {rank} {step.step}")
    accelerator.end_training()


if __name__ == "__main__":
    main(*sys.argv[1:4])
