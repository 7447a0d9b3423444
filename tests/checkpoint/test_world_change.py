"""Issue 41, item 4: a checkpoint written by another number of processes (DDP's per-rank random states, per-process
loader positions), and a rank that dies inside load_state: one line each, never a wall of tracebacks."""

from __future__ import annotations

import pytest

from launching import launch

SCRIPT = "world_change.py"
LINE = "the checkpoint was saved by 2 process(es) and is loaded by {n}"


@pytest.fixture(scope="module")
def saved_by_two(tmp_path_factory):
    root = tmp_path_factory.mktemp("world")
    launch(SCRIPT, root, "save", num_processes=2, timeout=300)
    return root


@pytest.mark.parametrize("processes", [1, 3])
def test_resumed_on_another_number_of_processes(saved_by_two, processes):
    result = launch(SCRIPT, saved_by_two, "load", num_processes=processes, timeout=300)
    out = result.stdout + result.stderr
    for rank in range(processes):
        assert f"rank {rank} LOADED" in result.stdout and f"rank {rank} TRAINED" in result.stdout, out
    assert out.count(LINE.format(n=processes)) == 1, out  # one warning, from the main process
    assert ("rank 2 has no random states saved" in out) == (processes == 3), out
    assert "Traceback" not in out and "generator state" not in out, out


def test_strict_refuses_it_in_one_line(saved_by_two):
    result = launch(SCRIPT, saved_by_two, "load", num_processes=1, env={"HASTEN_STRICT": "1"}, timeout=300,
                    check=False)
    assert result.returncode != 0
    assert "rank 0 ConfigError: load_state(" in result.stdout, result.stdout + result.stderr
    assert "the strict setting refuses this: load it with 2 process(es)" in result.stdout


def test_a_rank_that_dies_inside_load_state(saved_by_two):
    """Rank 1 SIGKILLs itself inside load_state: the launcher ends (no hang) with one line naming it, and the
    checkpoint, only read, loads on the next start."""
    result = launch(SCRIPT, saved_by_two, "load", num_processes=2, env={"KILL_IN_LOAD": "1"}, timeout=300,
                    check=False)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("hasten launch: rank 1 (local rank 1) was killed by signal 9"), result.stderr[-3000:]
    again = launch(SCRIPT, saved_by_two, "load", num_processes=2, timeout=300)
    assert again.stdout.count("TRAINED") == 2
