"""Preemption (issue 17, part 3): SIGTERM/SIGUSR1 -> a checkpoint at the next step boundary on every rank, exit
code 75, and a relaunch that finishes bit-identical to a run that was never stopped."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading

import pytest
import torch

from hasten import Accelerator, ProjectConfiguration

from hasten.resilience import preemption
from hasten.resilience.requeue import PREEMPTED_EXIT_CODE, all_preempted, exit_code_for_signal
from launching import SCRIPTS, launch
from test_auto_resume import SCRIPT, assert_same_finish


@pytest.fixture(autouse=True)
def no_handlers_left():
    yield
    if preemption._active is not None:
        preemption._active.uninstall()


def test_exit_codes():
    assert PREEMPTED_EXIT_CODE == 75
    assert exit_code_for_signal(signal.SIGTERM) == exit_code_for_signal(signal.SIGUSR1) == 75
    assert exit_code_for_signal(signal.SIGINT) == 130
    assert all_preempted([75, 75]) and all_preempted([75, -signal.SIGTERM])
    assert not all_preempted([75, 1]) and not all_preempted([-signal.SIGTERM]) and not all_preempted([-9, 75])


def test_slurm_requeue_runs_scontrol_from_the_first_machine_only(tmp_path, monkeypatch, capsys):
    from hasten.resilience.requeue import requeue_slurm_job

    calls = tmp_path / "calls"
    fake = tmp_path / "scontrol"  # stands in for SLURM's command: records its arguments
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    requeue_slurm_job(0)  # not under SLURM: nothing
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    requeue_slurm_job(1)  # not the first machine: nothing
    assert not calls.exists()
    requeue_slurm_job(0)
    assert calls.read_text().split() == ["requeue", "4242"]
    assert "requeued SLURM job 4242" in capsys.readouterr().err


def _accelerator(tmp_path, **project):
    from hasten.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True, **project)
    return Accelerator(gradient_accumulation_steps=2, project_config=config)


def test_handlers_are_opt_in(tmp_path):
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)
    _accelerator(tmp_path)
    _accelerator(tmp_path, automatic_resume=True, handle_preemption=False)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)) == before
    _accelerator(tmp_path, handle_preemption=True)
    assert signal.getsignal(signal.SIGTERM) != before[0] and signal.getsignal(signal.SIGUSR1) != before[1]
    preemption._active.uninstall()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)) == before


def test_a_signal_stops_at_the_end_of_the_next_optimizer_step(tmp_path):
    accelerator = _accelerator(tmp_path, handle_preemption=True)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    steps_done = []

    def micro_step():
        with accelerator.accumulate(model):
            accelerator.backward(model(torch.ones(2, 3)).sum())
            optimizer.step()
            optimizer.zero_grad()
            steps_done.append(accelerator.step)
            if len(steps_done) == 3:
                os.kill(os.getpid(), signal.SIGTERM)  # in the middle of micro-step 3 (of an accumulation window of 2)
                assert preemption.requested()

    with pytest.raises(SystemExit) as stopped:
        for _ in range(10):
            micro_step()
    assert stopped.value.code == PREEMPTED_EXIT_CODE
    assert steps_done == [1, 2, 3, 4]  # micro-step 3 did not step the optimizer: the boundary is after 4
    checkpoints = sorted(os.listdir(tmp_path / "checkpoints"))
    assert checkpoints == ["checkpoint_0"]
    saved = torch.load(tmp_path / "checkpoints" / "checkpoint_0" / "random_states_0.pkl", weights_only=True)
    assert saved["step"] == 4
    assert not os.path.exists(tmp_path / "checkpoints" / "checkpoint_0" / "gradients_0.safetensors")


def test_a_loop_without_accumulate_is_warned(tmp_path):
    accelerator = _accelerator(tmp_path, handle_preemption=True)
    accelerator.gradient_accumulation_steps = 1
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    with pytest.warns(UserWarning, match="outside `with accelerator.accumulate"):
        for _ in range(3):
            accelerator.backward(model(torch.ones(2, 3)).sum())
            optimizer.step()
            optimizer.zero_grad()


def _launch_and_signal(workdir, event_step: int, signum):
    """Launch the script, wait for its READY line (inside micro-step `event_step`), signal the launcher."""
    command = [sys.executable, "-m", "hasten", "launch", "--handle_preemption", "--num_processes", "2", str(SCRIPTS / SCRIPT),
               str(workdir), "flag", f"wait:{event_step}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HASTEN_", "ACCELERATE_"))}
    env["PYTHONUNBUFFERED"] = "1"
    stderr_path = os.path.join(workdir, "launcher.err")
    with open(stderr_path, "w") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    seen = []
    try:
        while not seen or not seen[-1].startswith("READY"):
            seen.append(lines.get(timeout=180))
        process.send_signal(signum)  # as SLURM or Kubernetes would: to the launcher only
        code = process.wait(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    process.stdout.close()
    while not lines.empty():
        seen.append(lines.get())
    with open(stderr_path) as handle:
        return code, "".join(seen), handle.read()


def _stopped_at(stdout: str) -> set:
    return {line.split()[2] for line in stdout.splitlines() if line.startswith("STOPPED")}


def test_launchers_preemption_side_is_opt_in(tmp_path, monkeypatch):
    """Default: as Accelerate's launcher (torch's agent signals, no SIGUSR1; a stopped or preempted run exits 1, no
    requeue). handle_preemption: SIGUSR1 passed on, 75 after a preemption, 128+n after another signal, requeue."""
    import torch.distributed.launcher.api as api
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from hasten.commands.launch import _run_distributed, launch_command_parser, plan_launch
    from hasten.resilience import requeue

    script = tmp_path / "train.py"
    script.write_text("")
    seen, requeued = [], []

    def fake_launch(config, entrypoint):
        def run(*args):
            seen.append(getattr(config, "signals_to_handle", ""))
            raise outcome

        return run

    monkeypatch.setattr(api, "elastic_launch", fake_launch)
    monkeypatch.setattr(requeue, "requeue_slurm_job", lambda rank: requeued.append(rank))
    preempted = {rank: ProcessFailure(local_rank=rank, pid=1, exitcode=75, error_file=str(tmp_path / "none"))
                 for rank in (0, 1)}
    saved = dict(os.environ)
    codes = {}
    try:
        for opt_in in ([], ["--handle_preemption"]):
            args = launch_command_parser().parse_args([*opt_in, "--cpu", "--num_processes", "2", str(script)])
            for name, outcome in (("usr1", SignalException("stop", signal.SIGUSR1)),
                                  ("int", SignalException("stop", signal.SIGINT)),
                                  ("workers75", ChildFailedError("train.py", preempted))):
                codes[bool(opt_in), name] = _run_distributed(args, plan_launch(args))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert [codes[False, n] for n in ("usr1", "int", "workers75")] == [1, 1, 1]
    assert [codes[True, n] for n in ("usr1", "int", "workers75")] == [75, 128 + signal.SIGINT, 75]
    assert "SIGUSR1" not in seen[0] and "SIGUSR1" in seen[-1]
    assert requeued == [0]  # SIGUSR1 with handle_preemption only


def test_preempted_three_ways_then_finished_bit_identical(tmp_path):
    os.makedirs(tmp_path, exist_ok=True)
    # 1. SIGUSR1 to rank 1 only, in the middle of micro-step 5 (accumulation windows of 2): the ranks' flags are
    # reduced from the boundary after micro-step 6 on and read at the next one, so both checkpoint after 8.
    first = launch(SCRIPT, tmp_path, "flag", "usr1:1:5", flags=["--handle_preemption"], check=False)
    assert first.returncode == PREEMPTED_EXIT_CODE, first.stdout + first.stderr
    assert first.stdout.count("STOPPED") == 2 and _stopped_at(first.stdout) == {"micro=8"}, first.stdout
    assert "SIGUSR1 received (rank 1 of 2)" in first.stderr and "exit code 75" in first.stderr
    # Saved after 3 and 6 by the script, after 8 for the preemption: one checkpoint, both ranks' files in it.
    newest = tmp_path / "checkpoints" / "checkpoint_2"
    assert torch.load(newest / "custom_checkpoint_0.pkl", weights_only=True)["micro"] == 8
    # (micro-step 8 ends the epoch, so the accumulation counter has just gone back to 0 on both ranks)
    assert [torch.load(newest / f"random_states_{r}.pkl", weights_only=False)["step"] for r in (0, 1)] == [0, 0]

    # 2. SIGTERM to the launcher in the middle of micro-step 11: the agent passes it on, the workers checkpoint
    # after micro-step 14, the launcher exits 75.
    code, stdout, stderr = _launch_and_signal(tmp_path, 11, signal.SIGTERM)
    assert "micro=8" in stdout.split("START", 2)[1], stdout  # resumed where the first launch stopped
    assert code == PREEMPTED_EXIT_CODE, stdout + stderr
    assert _stopped_at(stdout) == {"micro=14"} and "stopped by SIGTERM" in stderr, stdout + stderr

    # 3. SIGUSR1 to the launcher (SLURM's warning ahead of the time limit) in the middle of micro-step 17: the agent
    # survives it and passes it on (torch's agent would die of it by default); checkpoint after 20, exit 75.
    code, stdout, stderr = _launch_and_signal(tmp_path, 17, signal.SIGUSR1)
    assert "micro=14" in stdout.split("START", 2)[1], stdout
    assert code == PREEMPTED_EXIT_CODE, stdout + stderr
    assert _stopped_at(stdout) == {"micro=20"} and "stopped by SIGUSR1" in stderr, stdout + stderr

    # 4. Started again: resumes after micro-step 20 and ends exactly as the uninterrupted run (with the three
    # preemption checkpoints counted in the numbering).
    last = launch(SCRIPT, tmp_path, "flag", "none")
    assert "micro=20" in last.stdout.split("START", 2)[1]
    assert_same_finish(tmp_path, extra_saves=3)
