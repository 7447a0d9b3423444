"""Two processes log to every installed tracker library through `Accelerator(log_with=...)`.

Usage: tracking_libraries.py OUT_DIR TRACKER[,TRACKER...]
Rank 0 writes OUT_DIR/result.json with what the test needs to find each library's run.
"""

import enum
import json
import os
import sys
import time
import urllib.request
from pathlib import Path

import torch

from hasten import Accelerator
from hasten.tracking import GeneralTracker

out, names = Path(sys.argv[1]).resolve(), sys.argv[2].split(",")
# Work inside the test's folder: some libraries write to the current directory, and DVCLive runs
# `dvc init` (and `git add`) in whatever git repository encloses it.
os.chdir(out)
began = time.monotonic()


def mark(what):
    print(f"[{time.monotonic() - began:6.1f}s] {what}", flush=True)


class Schedule(enum.Enum):
    COSINE = "cosine"


CONFIG = {
    "lr": 0.01,
    "batch_size": 8,
    "optimizer": {"name": "adamw", "betas": (0.9, 0.999)},
    "weights": torch.tensor([1.0, 2.0]),
    "scale": torch.tensor(0.5),
    "warmup": None,
    "schedule": Schedule.COSINE,
    "layers": [64, 32],
}
STEPS = (0, 5, 10)

init_kwargs = {
    "wandb": {"mode": "offline", "dir": str(out)},
    "mlflow": {"run_name": "hasten-run"},
    "aim": {"system_tracking_interval": None, "log_system_params": False, "capture_terminal_logs": False},
    "dvclive": {"dir": str(out / "dvclive"), "save_dvc_exp": False, "dvcyaml": False},
    "clearml": {
        "auto_connect_frameworks": {"detect_repository": False, "tensorboard": False, "pytorch": False,
                                    "matplotlib": False},
        "auto_resource_monitoring": False, "auto_connect_streams": False, "auto_connect_arg_parser": False,
    },
    "comet_ml": {"online": False},
    "swanlab": {"mode": "offline", "log_dir": str(out / "swanlog")},
    "trackio": {"auto_log_cpu": False, "embed": False},
}

accelerator = Accelerator(log_with=names, project_dir=out / "project")
assert [str(kind) for kind in accelerator.log_with] == names, accelerator.log_with

health = os.environ.get("TEST_MLFLOW_HEALTH_URL")
if accelerator.is_main_process and health and "mlflow" in names:
    # The test boots `mlflow server` while these processes start; wait for it (bounded).
    deadline = time.monotonic() + 240
    while True:
        try:
            urllib.request.urlopen(health, timeout=2).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"mlflow server at {health} did not answer within 240 s")
            time.sleep(0.5)

mark("waited for the mlflow server")
accelerator.init_trackers("hasten_project", config=CONFIG,
                          init_kwargs={name: init_kwargs[name] for name in names if name in init_kwargs})

mark("init_trackers")
for step in STEPS:
    accelerator.log({"loss": torch.tensor(1.0 / (step + 1)), "accuracy": step / 10}, step=step)
# A second call at the same step, with a split prefix and a nested dict.
accelerator.log({"eval_loss": 0.25, "eval": {"f1": torch.tensor(0.75)}}, step=STEPS[-1])

if accelerator.is_main_process:
    assert sorted(tracker.name for tracker in accelerator.trackers) == sorted(names)
    result = {"trackers": [tracker.name for tracker in accelerator.trackers]}
    if "clearml" in names:
        result["clearml_folder"] = str(accelerator.get_tracker("clearml", unwrap=True).get_offline_mode_folder())
    if "mlflow" in names:
        result["mlflow_run_id"] = accelerator.get_tracker("mlflow", unwrap=True).info.run_id
    if "wandb" in names:
        result["wandb_dir"] = accelerator.get_tracker("wandb", unwrap=True).dir
    (out / "result.json").write_text(json.dumps(result))
else:
    # Every built-in tracker is main-process only: no run, no files, and calls on this rank are no-ops.
    assert accelerator.trackers == [], accelerator.trackers
    blank = accelerator.get_tracker("tensorboard")
    assert type(blank) is GeneralTracker and blank.tracker is None
    assert type(accelerator.get_tracker("wandb", unwrap=True)) is GeneralTracker  # as in Accelerate

accelerator.wait_for_everyone()
mark("logged")
accelerator.end_training()
mark("end_training")
print(f"rank {accelerator.process_index} done", flush=True)
