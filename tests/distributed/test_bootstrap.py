"""Launched processes exit 0 right after a collective, even when gloo's worker threads lag behind.

Without hasten's exit hook waiting for those threads, this launch aborted (signal 6, `terminate called without
an active exception`) in 3 of 3 runs; see docs/launch.md ("Exiting cleanly").
"""

from __future__ import annotations

from launching import launch


def test_script_that_ends_right_after_a_collective_exits_cleanly():
    result = launch("exit_after_collective.py", flags=["--cpu"])
    assert "terminate called" not in result.stderr, result.stderr
    assert result.stdout.count("EXIT CHECK collectives done") == 2, result.stdout + result.stderr
