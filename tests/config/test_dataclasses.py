"""Kwargs handlers: `to_kwargs` keeps what the user gave, and never touches os.environ."""

from __future__ import annotations

import os
from datetime import timedelta

from hasten.config.dataclasses import GradScalerKwargs, InitProcessGroupKwargs, TorchDynamoPlugin


def test_explicit_values_equal_to_the_default_are_kept():
    # 600 s is the NCCL default of the dataclass: dropping it let the run fall back to the 1800 s timeout
    assert InitProcessGroupKwargs(timeout=timedelta(seconds=600)).to_kwargs() == {"timeout": timedelta(seconds=600)}
    assert InitProcessGroupKwargs().to_kwargs() == {}
    assert GradScalerKwargs(65536.0).to_kwargs() == {"init_scale": 65536.0}  # positional counts as given
    assert GradScalerKwargs(growth_interval=10).to_kwargs() == {"growth_interval": 10}


def test_to_kwargs_reads_the_environment_without_changing_it(monkeypatch):
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "INDUCTOR")
    popped = []

    class Watched(type(os.environ)):
        def pop(self, key, *default):
            popped.append(key)
            return super().pop(key, *default)

    watched = Watched(os.environ._data, os.environ.encodekey, os.environ.decodekey, os.environ.encodevalue,
                      os.environ.decodevalue)
    monkeypatch.setattr(os, "environ", watched)
    assert TorchDynamoPlugin().to_kwargs()["backend"] == "inductor"  # from the variable: counts as set
    assert popped == [] and os.environ["ACCELERATE_DYNAMO_BACKEND"] == "INDUCTOR"
