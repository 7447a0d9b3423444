"""The crash test: load the newest checkpoint (checking it is whole), then save the next one, killed midway.

    ckpt_crash.py WORKDIR            one trial (through `hasten launch` for several processes); the caller sets
                                     HASTEN_TEST_CRASH_AT / HASTEN_TEST_CRASH_RANK to pick the kill point
    ckpt_crash.py WORKDIR --all      one process: a forked child per crash point 1, 2, 3, ... until a save runs
                                     through, once with automatic naming (WORKDIR/automatic) and once saving
                                     over one folder (WORKDIR/fixed); prints one JSON line per trial
Every checkpoint n holds weights all equal to n and a counter equal to n, so a half-written or mixed checkpoint
cannot pass the check. Children are forked from a parent that only imported torch (it runs no torch ops), so
each trial costs a fork rather than a Python start.
"""

import json
import os
import signal
import sys

import torch

from hasten import Accelerator, ProjectConfiguration


class Counter:
    def __init__(self):
        self.value = -1

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


def trial(workdir, fixed: bool = False):
    """fixed=False: automatic naming (a new folder per save, rotation); True: every save replaces one folder."""
    accelerator = Accelerator(project_config=ProjectConfiguration(
        project_dir=workdir, automatic_checkpoint_naming=not fixed, total_limit=None if fixed else 2))
    folder = os.path.join(workdir, "checkpoints", "fixed") if fixed else None
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    if os.path.isdir(os.path.join(workdir, "checkpoints")):
        accelerator.load_state(folder)  # None: the newest complete one
        n = counter.value
        for p in model.parameters():
            assert torch.all(p == n), f"rank {accelerator.process_index}: weights are not all {n}"
            assert torch.all(optimizer.state[p]["momentum_buffer"] == n), "optimizer state does not match"
        assert scheduler.scheduler.last_epoch == n, "scheduler state does not match"
        assert fixed or accelerator.project_configuration.iteration > n
        print(f"LOADED {n} on rank {accelerator.process_index}", flush=True)
        with open(os.path.join(workdir, f"loaded_{accelerator.process_index}.log"), "a") as log:
            log.write(f"{n}\n")
    n = counter.value + 1
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(n)
            optimizer.state[p]["momentum_buffer"] = torch.full_like(p, n)
    scheduler.scheduler.last_epoch = n
    counter.value = n
    path = accelerator.save_state(folder)
    print(f"SAVED {n} {path}", flush=True)
    accelerator.end_training()


def all_points(workdir):
    import torch._dynamo  # noqa: F401 - imported once here, not in every child (optimizers import it lazily)
    import safetensors.torch  # noqa: F401

    from hasten.checkpoint import layout, state_dicts  # noqa: F401
    from hasten.checkpoint.storage import durable, fast_io, marker as markers, safe_load  # noqa: F401

    for mode in ("automatic", "fixed"):
        folder = os.path.join(workdir, mode)
        fixed = mode == "fixed"
        trial_in_child(folder, None, fixed)  # the checkpoint every crash must leave intact (or replace whole)
        point = 1
        while True:
            status = trial_in_child(folder, point, fixed)
            root = os.path.join(folder, "checkpoints")
            visible = sorted(n for n in os.listdir(root) if not n.startswith("."))
            broken = [n for n in visible if not markers.is_complete(os.path.join(root, n))]
            print(json.dumps({"mode": mode, "point": point, "status": status, "visible": visible, "broken": broken,
                              "hidden": sorted(set(os.listdir(root)) - set(visible))}), flush=True)
            if status != "killed" or point > 200:
                break
            point += 1


def trial_in_child(workdir, crash_at, fixed=False):
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            if crash_at is not None:
                os.environ["HASTEN_TEST_CRASH_AT"] = str(crash_at)
            trial(workdir, fixed)
        except BaseException:  # noqa: BLE001 - report and leave with a failure code
            import traceback

            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return "killed" if os.WTERMSIG(status) == signal.SIGKILL else f"signal {os.WTERMSIG(status)}"
    return "ok" if os.WEXITSTATUS(status) == 0 else f"exit {os.WEXITSTATUS(status)}"


def main():
    if "--all" in sys.argv:
        all_points(sys.argv[1])
    else:
        trial(sys.argv[1])


if __name__ == "__main__":
    main()
