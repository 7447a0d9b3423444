"""What the GPU suite's cases share: the device at hand, the skip markers, the launcher that puts even one
process under torchrun (so its default group is NCCL on a GPU), and the figures table."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from launching import SCRIPTS, launch

CUDA = torch.cuda.is_available()
GPUS = torch.cuda.device_count() if CUDA else 0
# Two GPUs on a GPU machine; in CI the CPU twin runs with two gloo processes.
two_gpus = pytest.mark.skipif(CUDA and GPUS < 2, reason="needs 2 CUDA GPUs (its CPU twin runs in CI)")


def processes() -> int:
    """How many processes a multi-process case starts: one per GPU up to 2; 2 CPU processes in CI."""
    return min(2, GPUS) if CUDA else 2


def launch_world(script, *args, num_processes: int, env=None, flags=(), timeout: float = 300, check=True):
    """`hasten launch` for two processes or more; one process goes through torchrun too (`hasten launch` runs a
    single process in place, with no group: on one GPU "ddp" was a plain model and FSDP ran over a one-process
    gloo group), so that its default group is NCCL on a GPU, as on a real job."""
    if num_processes > 1:
        return launch(script, *args, num_processes=num_processes, env=env, flags=flags, timeout=timeout, check=check)
    assert not flags, "hasten launch flags need two processes or more here"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
               str(SCRIPTS / script), *map(str, args)]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("HASTEN_", "ACCELERATE_"))}
    full_env.update(env or {})
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=full_env)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited {result.returncode}\n--- stdout\n{result.stdout}\n"
                             f"--- stderr\n{result.stderr}")
    return result


def device_only_skips(result) -> int:
    """How many device-only assertions the worker skipped (none on a GPU)."""
    return result.stdout.count("device-only check skipped on CPU:")


def record_figure(name: str, value, unit: str = "", note: str = "") -> None:
    """One figure for gpu_check.sh's table (also printed, for `pytest -s`)."""
    print(f"\nFIGURE {name}: {value} {unit} {note}".rstrip())
    path = os.environ.get("HASTEN_GPU_FIGURES")
    if path:
        with open(path, "a") as handle:
            handle.write(json.dumps({"name": name, "value": value, "unit": unit, "note": note}) + "\n")
