"""Gathering for metrics: `gather_for_metrics` drops the samples even batching duplicated, and
`override_even_batches` switches even batching for `join_uneven_inputs`."""

from __future__ import annotations

import logging
import warnings

from torch.utils.data import BatchSampler

from ..core.nested import (
    is_torch_tensor,
    recursively_apply,
)
from .ranks import gather_data_parallel
from ..state import GradientState

logger = logging.getLogger(__name__)


# -- metrics -------------------------------------------------------------------------------------------------

def gather_for_metrics(input_data, use_gather_object: bool = False):
    """Gather `input_data` from every process, dropping the samples that even batching duplicated.

    Tensors (in nested lists/tuples/dicts) are all-gathered; anything else, or `use_gather_object=True`, goes
    through `gather_object` (a flat list). On the last batch of a prepared loader, only the first `remainder`
    gathered items are kept. Every process must call it the same number of times (not with even_batches=False
    when processes get different batch counts).
    """
    try:
        recursively_apply(lambda t: t, input_data, error_on_other_type=True)
        all_tensors = True
    except TypeError:
        all_tensors = False
    as_objects = use_gather_object or not all_tensors
    data = gather_data_parallel(input_data, as_objects)
    gradient_state = GradientState()
    if not gradient_state.end_of_dataloader:
        return data
    remainder = gradient_state.remainder
    if remainder == -1:
        logger.info(
            "gather_for_metrics: the dataset length is unknown, so duplicated samples on the last batch "
            "cannot be dropped; returning everything gathered."
        )
        return data
    if remainder > 0:
        if as_objects:
            return data[:remainder]
        return recursively_apply(lambda t: t[:remainder], data, test_type=is_torch_tensor)
    return data


class override_even_batches:
    """For `join_uneven_inputs(even_batches=...)`: set `even_batches` on the shard samplers of prepared map-style
    loaders for the block and restore them after; an iterable loader cannot change and is named in a warning."""

    def __init__(self, loaders, even_batches: bool):
        self.loaders, self.even_batches, self.saved = list(loaders), even_batches, []

    def __enter__(self):
        unchanged = []
        for loader in self.loaders:
            holder = loader.sampler if isinstance(loader.sampler, BatchSampler) else loader.batch_sampler
            if hasattr(holder, "even_batches"):
                self.saved.append((holder, holder.even_batches))
                holder.even_batches = self.even_batches
            else:
                unchanged.append(type(loader).__name__)
        if unchanged:  # Accelerate's words (a UserWarning, which scripts check), then which loaders
            warnings.warn("Overriding even_batches is only supported for map-style datasets, yet some dataloaders "
                          f"given were iterable: even_batches cannot be changed for {', '.join(unchanged)} (an "
                          "iterable or unsharded loader); it keeps its setting", stacklevel=4)
        return self

    def __exit__(self, *exc_info):
        for holder, value in self.saved:
            holder.even_batches = value
        return False
