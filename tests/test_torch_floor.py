"""The torch versions hasten declares: the floor is the oldest torch whose APIs the code calls."""

from __future__ import annotations

import re

from launching import REPO


def test_declared_torch_floor_covers_the_apis_used():
    text = (REPO / "pyproject.toml").read_text()
    floor = re.search(r'"torch>=(\d+)\.(\d+)', text)
    assert floor, "pyproject.toml declares no torch floor"
    # DataLoader(in_order=...) (prepare of a loader) and FSDP2's public fully_shard API need torch 2.6
    assert (int(floor.group(1)), int(floor.group(2))) >= (2, 6)
    assert f"torch {floor.group(1)}.{floor.group(2)}" in (REPO / "README.md").read_text(), \
        "record the run of the suite on the declared floor in README.md's install section"
