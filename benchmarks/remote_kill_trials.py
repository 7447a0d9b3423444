"""Kill trials for checkpoints in object storage (not run in CI: minutes).

A 2-process run (DDP, or FSDP2 with SHARDED_STATE_DICT: every rank uploads its own DCP shards) saves to an s3://
bucket on a moto server every step, automatic naming, `total_limit=2`. At a random moment after its first save the
whole job (hasten launch, torchrun and both workers, each stopped first) gets SIGKILL, mostly in the middle of an
upload, since uploading is what the loop spends its time on. Then a fresh run starts: `load_state()` (automatic
naming: the newest *committed* checkpoint) and checks it is whole: every weight and every optimizer buffer equals the
checkpoint's number n, the registered counter equals n, on both ranks. Between trials this script lists the bucket
itself (hasten's storage layer: checkpoints with a manifest) to know which checkpoint the next run must load.

Per backend it prints: trials, runs that loaded the newest committed checkpoint / runs, torn loads (a checkpoint
taken that was not whole: a mismatch, or a load that failed), kills that landed during an upload (the bucket held an
uncommitted version afterwards).
With `--kill upload` the kill comes as soon as the bucket shows objects of a save that has no manifest yet (this
script polls the bucket every 10 ms), so every kill lands in the middle of an upload.
Run: `python -m benchmarks.remote_kill_trials [--trials 10] [--backends ddp,fsdp2] [--seed 0] [--kill upload]`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a script (also by the launcher): make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BACKENDS = {
    "ddp": ["--cpu"],
    "fsdp2": ["--use_fsdp", "--fsdp_version", "2", "--fsdp_state_dict_type", "SHARDED_STATE_DICT"],
}
BUCKET = "hasten-kill"


# -- the launched worker ----------------------------------------------------------------------------------------
class Counter:
    def __init__(self):
        self.value = -1

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def worker(root: str) -> None:
    import torch

    from hasten import Accelerator, ProjectConfiguration

    accelerator = Accelerator(project_config=ProjectConfiguration(
        project_dir=root, automatic_checkpoint_naming=True, total_limit=2, automatic_resume=True))
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = accelerator.prepare(model, optimizer)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    rank = accelerator.process_index
    accelerator.backward(model(torch.randn(2, 512)).sum())  # momentum buffers exist after a step
    optimizer.step()
    optimizer.zero_grad()
    try:
        accelerator.load_state()  # the newest committed checkpoint, or none yet
    except Exception as error:  # noqa: BLE001 - a torn checkpoint taken is what the trials look for
        print(f"KILL_TRIAL {json.dumps({'rank': rank, 'loaded': None, 'error': f'{type(error).__name__}: {error}'})}",
              flush=True)
        raise
    n = counter.value
    whole = n < 0 or all(bool(torch.all(_local(p) == n)) for p in model.parameters()) and all(
        bool(torch.all(_local(optimizer.state[p]["momentum_buffer"]) == n)) for p in model.parameters())
    print(f"KILL_TRIAL {json.dumps({'rank': rank, 'loaded': n, 'whole': whole})}", flush=True)
    while True:
        n = counter.value + 1
        with torch.no_grad():
            for p in model.parameters():
                _local(p).fill_(n)
                _local(optimizer.state[p]["momentum_buffer"]).fill_(n)
        counter.value = n
        accelerator.save_state()
        if rank == 0:
            print(f"SAVED {n}", flush=True)


# -- the trials -------------------------------------------------------------------------------------------------
def _committed(root: str) -> list:
    from hasten.checkpoint.storage import storage_for

    from hasten.checkpoint.storage import folder as folders

    storage = storage_for(f"{root}/checkpoints")
    return sorted(folders.number_in(n) for n in storage.committed())


def _uncommitted_versions(fs, root: str) -> int:
    """Version prefixes in the bucket that no manifest names (what a killed upload left)."""
    found = 0
    base = f"{root[len('s3://'):]}/checkpoints"
    if not fs.exists(base):
        return 0
    for checkpoint in fs.ls(base, detail=False, refresh=True):
        try:
            entries = fs.ls(checkpoint, detail=False, refresh=True) if fs.isdir(checkpoint) else []
            manifest = f"{checkpoint}/hasten_checkpoint.json"
            named = json.loads(fs.cat(manifest)).get("objects_under") if manifest in entries else None
        except FileNotFoundError:  # rotation removed it meanwhile
            continue
        found += sum(e.rsplit("/", 1)[-1].startswith(".v-") and e.rsplit("/", 1)[-1] != named for e in entries)
    return found


def _descendants(pid: int) -> list:
    """`pid` and every process below it (torchrun starts its workers in sessions of their own, so a process group
    is not the whole job)."""
    children: dict = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def _kill_job(pid: int) -> None:
    """SIGKILL the launcher, torchrun and every worker at once (stopped first, so none reacts to another's death)."""
    job = _descendants(pid)
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for member in job:
            try:
                os.kill(member, sig)
            except ProcessLookupError:
                pass


def _upload_in_flight(fs, root: str) -> bool:
    """Whether the bucket holds objects of a save that is not committed yet (a version no manifest names)."""
    return _uncommitted_versions(fs, root) > 0


def _run(flags: list, root: str, env: dict, kill_after=None, timeout: float = 300, fs=None):
    """One launch; with `kill_after` seconds, SIGKILL the whole job that long after its first save. Returns the
    parsed KILL_TRIAL reports and the number of saves seen."""
    command = [sys.executable, "-m", "hasten", "launch", "--num_processes", "2", "--main_process_port", "0", *flags,
               os.path.abspath(__file__), "--worker", root]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                               start_new_session=True)
    reports, saves, started = [], 0, time.monotonic()
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            # the two workers' lines can meet on one line of torchrun's output: take every report in it
            reports += [json.loads(found) for found in re.findall(r"KILL_TRIAL (\{[^{}]*\})", line)]
            if "SAVED " in line:
                saves += 1
                if saves == 1 and kill_after is not None:
                    if fs is None:  # at a random moment
                        time.sleep(kill_after)
                    else:  # as soon as a save's objects are going up (its manifest not written yet)
                        while not _upload_in_flight(fs, root) and time.monotonic() - started < timeout:
                            time.sleep(0.01)
                    _kill_job(process.pid)
                    break
            if time.monotonic() - started > timeout:
                break
            if len(reports) == 2 and kill_after is None:
                break
    finally:
        _kill_job(process.pid)
        process.wait()
    if kill_after is not None and saves == 0 or len(reports) < 2:
        raise RuntimeError("the run did not load and save as it should:\n" + "".join(lines[-40:]))
    return reports, saves


def trials(backend: str, count: int, rng: random.Random, env: dict, fs, during_upload_only: bool = False) -> dict:
    root = f"s3://{BUCKET}/{backend}-{int(time.time())}"
    flags = BACKENDS[backend]
    env = {**env, "HASTEN_RUN_ID": f"kill-trials-{root}"}  # one job, restarted (as a requeue keeps its job id)
    loaded_newest, torn, during_upload, details = 0, 0, 0, []
    for trial in range(count):
        before = _committed(root)
        kill_after = rng.uniform(0.0, 2.0)
        reports, saves = _run(flags, root, env, kill_after=kill_after, fs=fs if during_upload_only else None)
        expected = before[-1] if before else -1
        good = len(reports) == 2 and all(r.get("loaded") == expected and r.get("whole") for r in reports)
        torn += sum(1 for r in reports if r.get("loaded") is None or not r.get("whole", False))
        loaded_newest += good
        leftover = _uncommitted_versions(fs, root)
        during_upload += leftover > 0
        details.append({"trial": trial, "expected": expected, "loaded": [r.get("loaded") for r in reports],
                        "kill_after_s": round(kill_after, 2), "saves_before_kill": saves,
                        "committed_after": _committed(root), "uncommitted_versions_after": leftover})
        print(f"  {backend} trial {trial}: {json.dumps(details[-1])}", flush=True)
    # the last kill's checkpoint must load too
    reports, _ = _run(flags, root, env)
    expected = _committed(root)[-1]
    final = len(reports) == 2 and all(r.get("loaded") == expected and r.get("whole") for r in reports)
    torn += sum(1 for r in reports if r.get("loaded") is None or not r.get("whole", False))
    return {"backend": backend, "trials": count, "loaded_newest_committed": loaded_newest + final, "runs": count + 1,
            "torn": torn, "kills_during_upload": during_upload}


def main(argv=None) -> int:
    if argv is None and "--worker" in sys.argv:
        worker(sys.argv[sys.argv.index("--worker") + 1])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--backends", default="ddp,fsdp2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kill", choices=["random", "upload"], default="random",
                        help="random: 0-2 s after the first save; upload: as soon as the bucket shows a save's objects "
                             "going up with no manifest yet (polled every 10 ms)")
    args = parser.parse_args(argv)

    import s3fs

    from benchmarks.remote_checkpoint import client_env, start_server

    server, endpoint = start_server()
    try:
        client_env(endpoint, tempfile.mkdtemp(prefix="hasten-kill-staging-"))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HASTEN_", "ACCELERATE_"))}
        env.update({k: os.environ[k] for k in os.environ if k.startswith("AWS_") or k == "HASTEN_STAGING_DIR"})
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                        os.path.join(os.path.dirname(os.path.dirname(
                                                            os.path.abspath(__file__))), "src"),
                                                        env.get("PYTHONPATH", "")) if p)
        fs = s3fs.S3FileSystem()
        fs.mkdir(BUCKET)
        rng = random.Random(args.seed)
        results = [trials(b, args.trials, rng, env, fs, args.kill == "upload") for b in args.backends.split(",")]
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    when = "at a random moment" if args.kill == "random" else "while a save's objects go up"
    print(f"\n### Kill trials: SIGKILL of a 2-process job saving to s3:// every step, {when}\n")
    print("| backend | trials | loaded the newest committed checkpoint / runs | torn checkpoints taken | "
          "kills that left an uncommitted upload |")
    print("| --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['backend']} | {r['trials']} | {r['loaded_newest_committed']}/{r['runs']} | {r['torn']} | "
              f"{r['kills_during_upload']}/{r['trials']} |")
    print(f"\n- load average (1/5/15 min): {'/'.join(f'{v:.2f}' for v in os.getloadavg())}, {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
