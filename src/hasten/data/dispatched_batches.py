"""What `DataLoaderDispatcher` may broadcast, and how a dispatched step is padded and measured.

A dispatched batch is a nested structure of tensors (sliced between processes) that may also carry plain values
beside them: a dict value (`{"input_ids": t, "source": "wiki"}`) or a field of a tuple/list that holds tensors
(`(t, "meta")`). Those travel pickled with the step's announcement and every process receives them whole.
Per-sample values (a list of strings, one per row) cannot be split the way tensors are, so they are refused
rather than handed whole to every process.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping

import torch

from ..core.errors import ConfigError
from ..core.nested import _rebuild_mapping, honor_type

_FIX = ("make the collate_fn return them as tensors, or pass dispatch_batches=False (every process then reads its "
        "own share)")


def check_dispatchable(batch, batches_per_step: int, distributed: bool) -> None:
    """Raise a one-line `ConfigError` unless `batch` can be broadcast and sliced by the dispatcher."""
    if rows_of(batch) is None:
        raise ConfigError(
            f"DataLoaderDispatcher slices batches by their tensors' rows, and a {type(batch).__name__} batch holds no "
            "tensor: make the collate_fn return tensors, or pass dispatch_batches=False."
        )
    plain = []
    _walk(batch, plain, holds_fields=True)
    if not plain:
        return
    found = type(plain[0]).__name__
    if batches_per_step > 1:
        raise ConfigError(
            f"DataLoaderDispatcher joins {batches_per_step} batches into each step and cannot join non-tensor "
            f"values (found a {found}): pass split_batches=True (one batch per step; such values then reach every "
            f"process whole), or {_FIX}."
        )
    if distributed:
        for value in plain:
            try:
                pickle.dumps(value)
            except Exception as error:  # noqa: BLE001 - any pickling failure means it cannot be sent
                raise ConfigError(
                    f"DataLoaderDispatcher sends non-tensor batch values to every process pickled, and a "
                    f"{type(value).__name__} cannot be pickled ({error}): {_FIX}."
                ) from None


def _walk(node, plain: list, holds_fields: bool) -> None:
    if isinstance(node, torch.Tensor):
        return
    if isinstance(node, Mapping):
        for value in node.values():
            _walk(value, plain, holds_fields=True)
        return
    if isinstance(node, (list, tuple)):
        # A sequence with a tensor in it is a record of fields; one without is a column of per-sample values.
        fields = any(isinstance(item, torch.Tensor) for item in node)
        for item in node:
            _walk(item, plain, holds_fields=fields)
        return
    if not holds_fields:
        raise ConfigError(
            f"DataLoaderDispatcher cannot split per-sample {type(node).__name__} values (a list of them in the "
            f"batch) between processes: {_FIX}."
        )
    plain.append(node)


def rows_of(batch) -> int:
    """The number of rows of a dispatched batch: the first dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    items = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
    for item in items:
        found = rows_of(item)
        if found is not None:
            return found
    return None


def pad_rows(batch, first_step, count: int):
    """`batch` with `count` more rows on every tensor, cycled from the epoch's `first_step`; other values as is."""
    if isinstance(batch, torch.Tensor):
        extra = first_step[torch.arange(count, device=first_step.device) % first_step.shape[0]]
        return torch.cat([batch, extra], dim=0)
    if isinstance(batch, Mapping):
        return _rebuild_mapping(batch, {key: pad_rows(value, first_step[key], count) for key, value in batch.items()})
    if isinstance(batch, (list, tuple)):
        return honor_type(batch, (pad_rows(item, ref, count) for item, ref in zip(batch, first_step)))
    return batch
