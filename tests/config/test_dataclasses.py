"""Kwargs handlers: `to_kwargs` returns what differs from the defaults (as Accelerate), and never touches os.environ."""

from __future__ import annotations

import os
from datetime import timedelta

from hasten.config.handlers import (
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    TorchDynamoPlugin,
    given_kwargs,
)


def test_to_kwargs_returns_only_values_that_differ_from_the_defaults():
    # As Accelerate documents: a value equal to the default is left out, even when passed on purpose.
    assert InitProcessGroupKwargs(timeout=timedelta(seconds=600)).to_kwargs() == {}
    assert InitProcessGroupKwargs(backend="gloo").to_kwargs() == {"backend": "gloo",
                                                                   "timeout": timedelta(seconds=1800)}
    assert InitProcessGroupKwargs().to_kwargs() == {}
    assert GradScalerKwargs(65536.0).to_kwargs() == {}
    assert GradScalerKwargs(growth_interval=10).to_kwargs() == {"growth_interval": 10}


def test_given_kwargs_remembers_what_the_constructor_was_given():
    # hasten's own callers keep a value passed on purpose: 600 s must not become the gloo default of 1800 s.
    handler = InitProcessGroupKwargs(timeout=timedelta(seconds=600))
    assert given_kwargs(handler) == {"timeout": timedelta(seconds=600)}
    assert given_kwargs(InitProcessGroupKwargs(backend="nccl"), ("timeout",)) == {}
    assert given_kwargs(GradScalerKwargs(65536.0)) == {"init_scale": 65536.0}  # positional counts as given
    assert given_kwargs(GradScalerKwargs(growth_interval=2000)) == {"growth_interval": 2000}
    plugin = GradientAccumulationPlugin(num_steps=2, adjust_scheduler=True)
    assert plugin.to_kwargs() == {"num_steps": 2}
    assert given_kwargs(plugin, ("adjust_scheduler",)) == {"num_steps": 2, "adjust_scheduler": True}


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
