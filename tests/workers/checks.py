"""A worker's running count of passed checks: each failing check names its rank, and `done()` prints the
`CHECKS-PASSED <rank> <count>` line the launching test counts (a check skipped by mistake shows as a lower count)."""

from __future__ import annotations


class Checks:
    def __init__(self, rank: int):
        self.rank, self.passed = rank, 0

    def __call__(self, condition, what: str) -> None:
        assert condition, f"rank {self.rank}: {what}"
        self.passed += 1

    def done(self) -> None:
        print(f"CHECKS-PASSED {self.rank} {self.passed}", flush=True)
