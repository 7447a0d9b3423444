"""`Accelerator.join_uneven_inputs`: processes that run out of batches first leave the collectives early
(torch's `Join`), and `even_batches` may be overridden on the prepared loaders while they do."""

from __future__ import annotations

import contextlib
import warnings

from ..core.enums import DistributedType


@contextlib.contextmanager
def join_uneven_inputs(accelerator, joinables, even_batches=None):
    # Unlike Accelerate, MULTI_CPU joins too: there Accelerate does nothing, and the process with the extra
    # batch waits forever in DDP's gradient all-reduce (its test_distributed_data_loop hangs on CPU).
    if not (accelerator.multi_device or (accelerator.use_distributed
                                         and accelerator.distributed_type == DistributedType.MULTI_CPU)):
        if accelerator.use_distributed:
            warnings.warn("Joining uneven inputs is only supported for multi-GPU training, as a result "
                          "`join_uneven_inputs` will have no effect.", stacklevel=3)
        yield
        return
    from torch.distributed.algorithms.join import Join

    from .metrics import override_even_batches

    saved = accelerator.even_batches
    loaders = accelerator._dataloaders if even_batches is not None else ()  # only an override touches the loaders
    if even_batches is not None:
        accelerator.even_batches = even_batches
    try:
        with override_even_batches(loaders, accelerator.even_batches), Join(joinables,
                                                                            enable=not accelerator.even_batches):
            yield
    finally:
        accelerator.even_batches = saved


__all__ = ["join_uneven_inputs"]
