"""Debug mode's hang doctor (hasten.resilience.hang_doctor): injected deadlocks end within seconds with one report.

Each case of tests/workers/hang_cases.py is a real 2-process gloo launch under `hasten launch --debug` with
the DEFAULT collective timeout (30 minutes), except the sleeping rank (10 s). The launch's own timeout is the
failure mode: without the doctor every case would hang. The report must be the last lines of the launcher's
output and name the right rank and the right `file:line`s (found by the `SITE:` markers in the script).
"""

from __future__ import annotations

import re

import pytest

from launching import SCRIPTS, launch

CASES = SCRIPTS / "hang_cases.py"
BANNER = "hasten hang doctor"
ENV = {"HASTEN_HANG_DOCTOR_WAIT": "1"}


def site(marker: str) -> str:
    """`hang_cases.py:<line>` of the line carrying `# SITE:<marker>`."""
    for number, line in enumerate(CASES.read_text().splitlines(), start=1):
        if line.rstrip().endswith(f"# SITE:{marker}"):
            return f"hang_cases.py:{number}"
    raise AssertionError(f"no SITE:{marker} in {CASES}")


def run_case(case: str, env=None, timeout: float = 60, may_run_ahead: bool = False) -> tuple[str, str]:
    """Launch one case; returns (the launcher's summary line, the report after it) and checks they come last.

    `may_run_ahead`: gloo completes some mismatched pairs on one side or both (equal sizes, or a smaller
    all_reduce against a larger one), and the doctor checks off the main thread, so a rank may finish the
    script's last lines before its checker stops the run; the run must fail with the report all the same.
    """
    result = launch(CASES, case, flags=["--debug"], env={**ENV, **(env or {})}, timeout=timeout, check=False)
    assert result.returncode != 0, result.stderr
    if not may_run_ahead:
        assert "RANK 0 FINISHED" not in result.stdout, result.stdout
    lines = result.stderr.rstrip().splitlines()
    summaries = [i for i, line in enumerate(lines) if line.startswith("hasten launch:")]
    assert len(summaries) == 1, result.stderr
    report = "\n".join(lines[summaries[0] + 1:])
    assert report, f"no report after the launcher's line:\n{result.stderr}"
    assert report.count(BANNER) <= 1 and report.count("hasten debug mode:") <= 1, result.stderr
    return lines[summaries[0]], report


def headline(report: str) -> str:
    lines = report.splitlines()
    return lines[1] if lines[0].strip("= ") == BANNER else lines[0]


def test_rank_skips_a_barrier():
    summary, report = run_case("skip-barrier")
    first = headline(report)
    assert first.startswith("rank 1 diverged at collective #2 of the default group"), report
    assert f"it calls reduce() at tests/workers/{site('skip-barrier-reduce')}" in first
    assert f"rank 0 calls barrier() at tests/workers/{site('skip-barrier-wait')}" in first
    # where each rank's Python stack is
    assert re.search(r"rank 0: .*barrier\(\)", report) and re.search(r"rank 1: .*reduce\(\)", report), report
    assert f"{site('skip-barrier-wait')} in skip_barrier" in report
    assert f"{site('skip-barrier-reduce')} in skip_barrier" in report
    assert "rank 1 (local rank 1) failed: HangDetectedError" in summary


def test_rank_conditional_collective():
    _, report = run_case("conditional")
    first = headline(report)
    assert first.startswith("rank 1 diverged"), report
    assert f"it calls gather() at tests/workers/{site('conditional-gather')}" in first
    assert f"rank 0 calls barrier() at tests/workers/{site('conditional-wait')}" in first


def test_mismatched_shapes_in_gather():
    summary, report = run_case("shapes")
    assert "`gather` got tensors whose shapes and dtypes differ" in report and "rank 1 differs" in report
    assert f"rank 0: [1, 2] float32 on cpu at tests/workers/{site('shapes')}" in report
    assert f"rank 1: [2, 2] float32 on cpu at tests/workers/{site('shapes')}" in report
    assert "rank 1 (local rank 1) failed: DistributedOperationException" in summary


def test_mismatched_dtypes_in_reduce():
    _, report = run_case("dtypes")
    assert "`reduce` got tensors whose shapes and dtypes differ" in report and "rank 1 differs" in report
    assert f"rank 1: [2] float64 on cpu at tests/workers/{site('dtypes')}" in report


def test_one_rank_skips_part_of_evaluation():
    _, report = run_case("skip-eval")
    first = headline(report)
    assert first.startswith("rank 1 diverged at collective #4"), report
    assert f"it calls barrier() at tests/workers/{site('eval-wait')}" in first
    assert f"rank 0 calls gather() at tests/workers/{site('eval-gather')}" in first


def test_rank_sleeps_past_the_timeout():
    """The one case that waits for the timeout (10 s here): the report comes within the timeout + 5 s."""
    # NCCL_SOCKET_IFNAME alone: the workers' gloo takes that interface (issue 30, item 10) and the report names it.
    _, report = run_case("sleeps", env={"HASTEN_COLLECTIVE_TIMEOUT": "10", "NCCL_SOCKET_IFNAME": "lo"})
    first = headline(report)
    assert "Network: gloo uses network interface lo (GLOO_SOCKET_IFNAME=lo (from NCCL_SOCKET_IFNAME))" in report, report
    assert f"barrier() at tests/workers/{site('sleep-wait')} timed out on rank 0" in first, report
    assert "the collective timeout is 10s" in first
    assert "rank 1 never arrived (it is running Python code at " \
           f"tests/workers/{site('sleep')} in sleeps)" in first
    # the 10 s setting, not the 30-minute default, ended it (no tighter bound: the machine may be loaded)
    assert 10 <= int(re.search(r"timed out on rank 0 after (\d+)s", first).group(1)) < 60, first


def test_frozen_rank():
    """A rank that hangs without dying (SIGSTOP): the others are told at the collective timeout which rank stopped
    answering, that its process is stopped, and where it was last seen; the doctor wakes it (SIGCONT) so that it
    ends with the others instead of ignoring the launcher's SIGTERM until the agent's kill, 30 s later."""
    summary, report = run_case("frozen", env={"HASTEN_COLLECTIVE_TIMEOUT": "10"})
    first = headline(report)
    assert f"barrier() at tests/workers/{site('frozen-wait')} timed out on rank 0" in first, report
    assert re.search(r"rank 1 stopped answering: its process \(pid \d+ on this machine\) is stopped, alive but not "
                     r"running \(SIGSTOP", first), first
    assert "last seen" in first and f"running Python code at tests/workers/{site('frozen-work')} in frozen" in first
    assert "killed by signal 9" not in summary, summary  # woken, it ended itself (the agent's kill came 30 s later)


def test_frozen_rank_while_the_other_waits_in_a_collective_made_in_cpp():
    """DDP's gradient all-reduce is not watched: gloo's own timeout ends the waiting rank, and on its way out the
    doctor names the rank that stopped answering (and wakes it, so that it ends too)."""
    result = launch(CASES, "frozen-in-backward", flags=["--debug"], timeout=120, check=False,
                    env={**ENV, "HASTEN_COLLECTIVE_TIMEOUT": "10"})
    assert result.returncode != 0
    said = [line for line in result.stderr.splitlines() if line.startswith("hasten hang doctor: rank 0's collective")]
    assert len(said) == 1, result.stderr[-3000:]
    assert re.search(r"timed out: rank 1 stopped answering: its process \(pid \d+ on this machine\) is stopped",
                     said[0]), said[0]
    assert f"running Python code at tests/workers/{site('frozen-backward-work')} in frozen_in_backward" in said[0]


def test_collective_queued_but_never_completed():
    """A call that returns before its collective completes (NCCL on a GPU; async_op=True here) still counts as
    waiting: the report comes at 90 % of the timeout, naming the collective and the rank that never arrived."""
    _, report = run_case("queued", env={"HASTEN_COLLECTIVE_TIMEOUT": "10"})
    first = headline(report)
    assert f"all_reduce(float32[4] op=SUM) at tests/workers/{site('queued-all-reduce')} timed out on rank 0" in first, report
    assert "its call returned, but the backend never completed it" in first
    assert "rank 1 never arrived (it is running Python code at " \
           f"tests/workers/{site('queued-sleep-1')} in queued)" in first
    assert 9 <= int(re.search(r"timed out on rank 0 after (\d+)s", first).group(1)) < 60, first


def test_broadcast_against_all_reduce():
    _, report = run_case("broadcast-vs-all-reduce", may_run_ahead=True)
    first = headline(report)
    assert first.startswith("rank 1 diverged"), report
    assert f"it calls all_reduce(float32[4] op=SUM) at tests/workers/{site('all-reduce')}" in first
    assert f"rank 0 calls broadcast() at tests/workers/{site('broadcast')}" in first


def test_users_own_all_reduce_with_mismatched_shapes():
    _, report = run_case("user-all-reduce", may_run_ahead=True)
    first = headline(report)
    assert first.startswith("rank 1 diverged"), report
    assert f"it calls all_reduce(float32[4] op=SUM) at tests/workers/{site('user-all-reduce')}" in first
    assert f"rank 0 calls all_reduce(float32[3] op=SUM) at tests/workers/{site('user-all-reduce')}" in first
    assert "(same collective, different tensors)" in first


def test_rank_returns_early():
    summary, report = run_case("exits-early")
    # rank 1 exited 0: the one failed process is rank 0, which the doctor stopped
    assert "rank 0 (local rank 0) was stopped by debug mode's hang doctor (report below)" in summary, summary
    first = headline(report)
    assert first.startswith("rank 1 returned from its script"), report
    assert f"while rank 0 waits in barrier() at tests/workers/{site('exit-wait')}" in first
    assert "which rank 1 never reached" in first


def test_rank_raises_while_the_other_waits():
    summary, report = run_case("raises")
    first = headline(report)
    assert first.startswith(f"rank 1 raised ValueError: rank 1 fails on purpose at tests/workers/{site('raise')}"), report
    assert f"while rank 0 waits in barrier() at tests/workers/{site('raise-wait')}" in first
    assert summary.startswith("hasten launch: rank 1 (local rank 1) failed: ValueError"), summary


# -- no false alarms, and nothing at all when debug mode is off -------------------------------------------------

@pytest.mark.parametrize("debug", [True, False], ids=["debug", "off"])
def test_correct_run_is_left_alone(debug):
    result = launch("hang_healthy.py", flags=["--debug"] if debug else [], env=ENV, timeout=120)
    for rank in range(2):
        assert f"HEALTHY RANK {rank} debug={debug}" in result.stdout, result.stderr
    assert BANNER not in result.stderr


def test_off_in_a_single_process_installs_nothing():
    import torch.distributed as dist

    from hasten.resilience import hang_doctor
    from hasten.state import PartialState

    PartialState._reset_state()
    try:
        PartialState()
        assert not hang_doctor.active()
        assert not any(getattr(getattr(dist, name), "_hasten_doctor", False) for name in hang_doctor.WRAPPED)
    finally:
        PartialState._reset_state()


# -- pieces without processes -------------------------------------------------------------------------------

def test_call_site_is_the_callers_line():
    import sys

    from hasten.resilience import hang_doctor

    here, line = hang_doctor.call_site(1), sys._getframe().f_lineno
    assert here.endswith(f"test_hang_doctor.py:{line}"), here


def test_odd_ones_out_takes_the_majority_and_rank_0_in_a_tie():
    from hasten.resilience.hang_report import odd_ones

    a, b = ("all_reduce", "float32[4]", "x.py:1"), ("barrier", "", "x.py:2")
    assert odd_ones({0: a, 1: a, 2: b}) == [2]
    assert odd_ones({0: b, 1: a, 2: a}) == [0]
    assert odd_ones({0: a, 1: b}) == [1]


def test_collective_timeout_setting_reaches_the_process_group_kwargs(monkeypatch):
    from datetime import timedelta

    from hasten.distributed.bootstrap import collective_timeout

    monkeypatch.delenv("HASTEN_COLLECTIVE_TIMEOUT", raising=False)
    assert collective_timeout() == timedelta(seconds=1800)
    monkeypatch.setenv("HASTEN_COLLECTIVE_TIMEOUT", "42")
    assert collective_timeout() == timedelta(seconds=42)
    assert collective_timeout(timedelta(minutes=2)) == timedelta(seconds=120)  # code wins
    # Unset, an NCCL group keeps torch's own 600 s (what an Accelerate script gets); a set value applies to it too.
    monkeypatch.delenv("HASTEN_COLLECTIVE_TIMEOUT")
    assert collective_timeout(None, "nccl") == timedelta(seconds=600)
    assert collective_timeout(None, "cpu:gloo,cuda:nccl") == timedelta(seconds=600)
    assert collective_timeout(None, "gloo") == timedelta(seconds=1800)
    assert collective_timeout(timedelta(seconds=900), "nccl") == timedelta(seconds=900)
    monkeypatch.setenv("HASTEN_COLLECTIVE_TIMEOUT", "42")
    assert collective_timeout(None, "nccl") == timedelta(seconds=42)


def test_checker_compares_each_collective_with_the_reference_ranks_in_batches():
    """The lowest rank posts its fingerprints in chunks; another rank compares its own by collective number."""
    from collections import deque

    import torch.distributed as dist

    from hasten.resilience.hang_doctor import _CHUNK, Doctor

    store = dist.HashStore()
    reference, other = Doctor(store, store, 0, 2, 60, 1), Doctor(store, store, 1, 2, 60, 1)
    found = []
    other.survey = lambda store: {}
    other._published = lambda: None
    other._report_divergence = lambda entry, statuses, known=None, raise_here=False: found.append((entry.seq, known))

    def issue(doctor, count, name="all_reduce", detail="float32[4] op=SUM"):
        for _ in range(count):
            doctor.leave(doctor.enter(name, detail, None, "train.py:7"))
        return deque(doctor.unchecked.popleft() for _ in range(len(doctor.unchecked)))

    cache = {}
    mine = issue(other, 40)
    assert not other._check_group(store, "default", mine, cache) and len(mine) == 40  # nothing posted yet
    posted = issue(reference, _CHUNK + 6)  # two chunks
    assert not reference._check_group(store, "default", posted, {}) and reference.checked_seqs["default"] == _CHUNK + 6
    assert not other._check_group(store, "default", mine, cache) and other.checked_seqs["default"] == 40
    mine = issue(other, _CHUNK - 40)
    mine += issue(other, 1, "barrier", "")  # the first collective of the second chunk differs
    assert other._check_group(store, "default", mine, cache)
    assert found == [(_CHUNK + 1, {0: ("all_reduce", "float32[4] op=SUM", "train.py:7")})]
    assert other.checked_seqs["default"] == _CHUNK


def test_a_completed_work_object_is_judged_by_wait_not_by_the_deprecated_exception_call(one_process_group):
    """torch 2.11's `Work.exception()` cannot hand its value back to Python (a TypeError), and the watchdog thread
    that asked it died at the first finished `async_op` collective: hangs went unreported from then on. A finished
    work object is judged by `wait()`, which returns at once or raises the backend's error."""
    import torch
    import torch.distributed as dist

    from hasten.resilience.completion import is_finished

    class Work:
        def __init__(self, completed, error=None):
            self.completed, self.error = completed, error

        def is_completed(self):
            return self.completed

        def wait(self):
            if self.error is not None:
                raise self.error
            return True

        def exception(self):  # as torch 2.11's binding behaves
            raise TypeError("Unable to convert function return value to a Python type!")

    assert is_finished(Work(True))
    assert not is_finished(Work(False))
    assert not is_finished(Work(True, RuntimeError("the backend's own timeout")))  # still named by a report
    work = dist.all_reduce(torch.ones(2), async_op=True)
    work.wait()
    assert is_finished(work)
