"""Faults injected into a 2-process CPU run, side by side: hasten and Accelerate (issue 41's fault table).

    python benchmarks/fault_trials.py --python /path/to/venv/bin/python --lib accelerate --trials 3 [--faults ...]

`--python` is the interpreter of the environment to test (hasten's venv with PYTHONPATH=src, or one with
`accelerate==1.15.0`); the script starts itself there as the worker. Each trial is a fresh folder; the results
print as one line per fault: `lib fault: ok/trials  (details)`. No numbers are judged here: this is a driver for
docs/fault_tolerance.md, not a test. Launchers: `hasten launch --num_processes 2` and, for Accelerate,
`accelerate launch --multi_gpu --num_processes 2` (its multi-process CPU path, torchrun underneath).

Faults: `kill-rank` (SIGKILL rank 1 in the middle of a save: the launcher's end, then the next start must load),
`term-launcher` (SIGTERM the launcher in the middle of a save; next start loads), `kill-launcher` (SIGKILL the
launcher alone: no worker may be left 5 s later), `disk-full` (a tmpfs too small for the next checkpoint, root
only: the error, leftovers, the previous checkpoint), `bit-flip` (one byte of the committed weights flipped: does
load_state notice?), `frozen` (SIGSTOP rank 1 while training, collective timeout 10 s: time until the run ends, and
what it says), `world` (saved by 2 processes, loaded by 1), `kill-job-zero2` / `kill-job-zero3` (DeepSpeed ZeRO-2 or
ZeRO-3 on the CPU, `--use_deepspeed --deepspeed_config_file` for both launchers: SIGKILL the whole job, launcher and
workers at once, in the middle of a save, as a node loses power; the next start must load). The DeepSpeed faults
need `deepspeed` in the environment tested (and, for Accelerate, `transformers`).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

FAULTS = ("kill-rank", "term-launcher", "kill-launcher", "disk-full", "bit-flip", "frozen", "world", "kill-job-zero2",
          "kill-job-zero3")


# -- the worker (runs under the library tested) ----------------------------------------------------------------
def worker(lib: str, root: str, mode: str) -> None:
    import datetime

    import torch

    deepspeed = os.environ.get("FAULT_TRIALS_ZERO_STAGE") is not None  # the plugin comes from the launcher's flags

    if lib == "hasten":
        from hasten import Accelerator
        from hasten.utils import InitProcessGroupKwargs, ProjectConfiguration
    else:
        from accelerate import Accelerator
        from accelerate.utils import InitProcessGroupKwargs, ProjectConfiguration
    # 10 s, for the frozen rank; the DeepSpeed runs get 60 s, as their store connection gave up after 10 s on the
    # loaded 2-core machine (a start that fails for the machine's load is not what the trial asks)
    timeout = InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=60 if deepspeed else 10))
    # Accelerate runs DeepSpeed only without cpu=True (DeepSpeed's CPU accelerator, DS_ACCELERATOR=cpu, is the device)
    acc = Accelerator(cpu=not deepspeed, kwargs_handlers=[timeout], project_config=ProjectConfiguration(
        project_dir=root, automatic_checkpoint_naming=True, total_limit=3))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)])  # 8 MB of weights, 24 MB saved
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = acc.prepare(model, optimizer)
    # torch's rank: Accelerate 1.15 under DeepSpeed on a CPU calls every process "process 0 of 1"
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else acc.process_index
    with open(os.path.join(root, f"pid_{rank}"), "w") as handle:  # (two ranks' prints may interleave)
        handle.write(str(os.getpid()))
    if rank == 0 and mode != "train":
        print(f"DISTRIBUTED {acc.distributed_type}", flush=True)
    if mode in ("resume", "load1"):
        acc.load_state()  # the newest checkpoint (Accelerate: the last folder by number)
        print(f"LOADED {rank}", flush=True)
        return
    steps = 1 if mode == "once" else 1000
    for step in range(steps):
        loss = model(torch.randn(8, 512)).pow(2).mean()
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        print(f"SAVING {rank} {step}", flush=True)
        acc.save_state()
        print(f"SAVED {rank} {step}", flush=True)


# -- the driver -------------------------------------------------------------------------------------------------
def command(args, root: str, mode: str, processes: int = 2, stage: int | None = None) -> list:
    me = os.path.abspath(__file__)
    if args.lib == "hasten":
        launcher = [args.python, "-m", "hasten", "launch", "--num_processes", str(processes), "--main_process_port", "0",
                    *args.launch_flags]
    else:
        launcher = [args.python, "-m", "accelerate.commands.launch", "--num_processes", str(processes),
                    "--main_process_port", str(random.randint(20000, 40000))]
        if stage is None:
            launcher += ["--multi_gpu"] if processes > 1 else ["--cpu"]
    if stage is not None:
        launcher += ["--use_deepspeed", "--deepspeed_config_file", deepspeed_config(root, stage, processes)]
    return [*launcher, me, "--worker", args.lib, root, mode]


def deepspeed_config(root: str, stage: int, processes: int) -> str:
    """Batch sizes written out: Accelerate 1.15 on a CPU counts a DeepSpeed run as 1 process (its state does not read
    the world size there) and would fill "auto" with a train_batch_size DeepSpeed refuses."""
    path = os.path.join(root, f"zero{stage}.json")
    with open(path, "w") as handle:
        json.dump({"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
                   "train_batch_size": 8 * processes, "zero_optimization": {"stage": stage}}, handle)
    return path


def start(args, root, mode, processes=2, stage=None):
    env = dict(os.environ)
    if stage is not None:
        env.update(FAULT_TRIALS_ZERO_STAGE=str(stage), DS_ACCELERATOR="cpu")
    return subprocess.Popen(command(args, root, mode, processes, stage), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env)


def wait_for(proc, word: str, timeout: float = 120) -> tuple:
    """Read lines until one holds `word`; returns (that line, every line so far)."""
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if word in line:
            return line, lines
    return None, lines


def pids_of(root) -> dict:
    pids = {}
    for rank in (0, 1):
        with open(os.path.join(root, f"pid_{rank}")) as handle:
            pids[rank] = int(handle.read())
    return pids


def finish(proc, timeout: float = 120, root: str | None = None) -> tuple:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_all(proc, root)
        out, _ = proc.communicate()
        return None, out
    return proc.returncode, out


def kill_all(proc, root: str | None) -> None:
    """SIGKILL the launcher's process group and every worker of this trial (torchrun starts each worker in a session
    of its own, so the launcher's group does not hold them)."""
    workers = []
    for rank in (0, 1):
        try:
            with open(os.path.join(root, f"pid_{rank}")) as handle:
                pid = int(handle.read())
            with open(f"/proc/{pid}/cmdline", "rb") as handle:  # still this trial's worker, not a reused pid
                line = handle.read().split(b"\0")
            if b"--worker" in line and root.encode() in line:
                workers.append(pid)
        except (OSError, ValueError, TypeError):
            continue
    for pid in workers:
        try:
            group = os.getpgid(pid)
            if group != os.getpgrp():
                os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def resumes(args, root, stage=None) -> bool:
    code, out = finish(start(args, root, "resume", stage=stage), root=root)
    return code == 0 and out.count("LOADED") == 2


def mid_save(proc, root):
    """Run until rank 1 starts its third save, then a few ms into it; returns the worker pids."""
    for _ in range(3):
        wait_for(proc, "SAVING 1")
    time.sleep(random.uniform(0.0, 0.05))
    return pids_of(root)


def trial_kill_rank(args, root):
    proc = start(args, root, "train")
    pids = mid_save(proc, root)
    killed = time.monotonic()
    os.kill(pids[1], signal.SIGKILL)
    code, out = finish(proc, root=root)
    took = time.monotonic() - killed
    tail = "\n".join(out.splitlines()[-15:])
    named = "rank 1" in tail or "local_rank: 1" in tail
    ok = code not in (0, None) and resumes(args, root)
    return ok, f"ended {took:.1f}s after the kill, names rank 1 at the end: {named}"


def trial_term_launcher(args, root):
    proc = start(args, root, "train")
    mid_save(proc, root)
    proc.send_signal(signal.SIGTERM)
    code, _ = finish(proc, root=root)
    return code is not None and resumes(args, root), f"exit code {code}"


def trial_kill_launcher(args, root):
    proc = start(args, root, "train")
    pids = mid_save(proc, root)
    proc.kill()
    proc.wait()
    time.sleep(5)
    left = [pid for pid in pids.values() if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return not left, f"{len(left)} worker(s) left after 5 s"


def trial_disk_full(args, root):
    mount = os.path.join(root, "small")
    os.makedirs(mount)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", mount], capture_output=True).returncode:
        return None, "mounting a tmpfs needs root"
    try:
        code, out = finish(start(args, mount, "train"), timeout=300)  # saves until the disk is full
        last_error = [line for line in out.splitlines() if "Error" in line or "error" in line][-1:]
        leftovers = [n for n in os.listdir(os.path.join(mount, "checkpoints")) if n.startswith(".")]
        loads = resumes(args, mount)
        return loads and not leftovers, (f"loads after: {loads}; temporary folders left: {len(leftovers)}; "
                                         f"error: {last_error[0][:300] if last_error else None}")
    finally:
        subprocess.run(["umount", mount], capture_output=True)


def kill_job(args, root, stage):
    """SIGKILL the launcher and every worker at once, a few ms into rank 1's third save."""
    proc = start(args, root, "train", stage=stage)
    mid_save(proc, root)
    kill_all(proc, root)
    proc.communicate()
    time.sleep(1)
    left = [pid for pid in pids_of(root).values() if alive(pid)]
    assert not left, f"workers {left} survived the kill"
    code, out = finish(start(args, root, "resume", stage=stage), root=root)
    ok = code == 0 and out.count("LOADED") == 2
    kind = [line.split()[-1] for line in out.splitlines() if line.startswith("DISTRIBUTED")][:1]
    assert not kind or "DEEPSPEED" in kind[0], f"not a DeepSpeed run: {kind}"
    if ok:
        return True, "next start loads"
    logs = os.environ.get("FAULT_TRIALS_LOGS")  # a folder to keep the failed start's output in
    if logs:
        with open(os.path.join(logs, f"{args.lib}-zero{stage}-{os.path.basename(root)}.txt"), "w") as handle:
            handle.write(out)
    if "DistNetworkError" in out:  # the machine's load, not the checkpoint: counted apart
        return None, "next start could not reach its rendezvous store (not a checkpoint failure)"
    lines = [line.strip() for line in out.splitlines()]
    said = [i for i, line in enumerate(lines) if "Error" in line and "ChildFailedError" not in line][-1:]
    where = [line for line in lines[:said[0]] if line.lstrip("[rank0]: ").startswith("File ")][-1:] if said else []
    return False, f"next start fails: {lines[said[0]][:160] if said else code} {where[0][-120:] if where else ''}"


def trial_kill_job_zero2(args, root):
    return kill_job(args, root, 2)


def trial_kill_job_zero3(args, root):
    return kill_job(args, root, 3)


def trial_bit_flip(args, root):
    finish(start(args, root, "once"))
    folder = sorted(glob.glob(os.path.join(root, "checkpoints", "checkpoint_*")))[-1]
    path = os.path.join(folder, "model.safetensors")
    with open(path, "r+b") as handle:
        handle.seek(os.path.getsize(path) // 2)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0x10]))
    code, out = finish(start(args, root, "resume"))
    detected = code != 0
    said = [line for line in out.splitlines() if "corrupt" in line or "Error" in line][-1:]
    return detected, f"load_state {'refused' if detected else 'loaded the damaged weights'}: {said[0][:200] if said else ''}"


def trial_frozen(args, root):
    proc = start(args, root, "train")
    pids = mid_save(proc, root)
    wait_for(proc, "SAVED 1")
    frozen = time.monotonic()
    os.kill(pids[1], signal.SIGSTOP)
    code, out = finish(proc, timeout=180)
    took = time.monotonic() - frozen
    for pid in pids.values():
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    names = "stopped answering" in out or "is stopped" in out
    return code not in (0, None), f"ended {took:.0f}s after SIGSTOP (timeout 10 s); says rank 1 is frozen: {names}"


def trial_world(args, root):
    finish(start(args, root, "once"))
    code, out = finish(start(args, root, "load1", processes=1))
    said = [line for line in out.splitlines() if "process" in line and ("saved by" in line or "random" in line)]
    return code == 0 and "LOADED 0" in out, f"exit {code}; said: {said[-1][:200] if said else 'nothing'}"


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:5])
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--lib", choices=("hasten", "accelerate"), required=True)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--faults", nargs="*", default=list(FAULTS), choices=FAULTS)
    parser.add_argument("--launch-flags", nargs="*", default=[], help="more hasten launch flags, e.g. --debug")
    args = parser.parse_args()
    once = {"disk-full", "bit-flip", "world"}  # deterministic: one trial says it
    for fault in args.faults:
        results = []
        for _ in range(1 if fault in once else args.trials):
            root = tempfile.mkdtemp(prefix="hasten-fault-")
            try:
                results.append(globals()[f"trial_{fault.replace('-', '_')}"](args, root))
            finally:
                shutil.rmtree(root, ignore_errors=True)
        good = sum(1 for ok, _ in results if ok)
        counted = [result for result in results if result[0] is not None]  # None: the trial could not judge
        details = " | ".join(sorted({detail for _, detail in results}))
        print(f"{args.lib} {fault}: {good}/{len(counted)}  ({details})", flush=True)


if __name__ == "__main__":
    main()
