"""`Accelerator.maybe_context_parallel`: split attention inputs along the sequence over the `cp` mesh dimension.

Built on torch.distributed.tensor.experimental.context_parallel (ring attention inside SDPA). CUDA only: on CPU
processes torch 2.13 has no sharding rule for the CPU attention kernel, so a layout with cp_size > 1 is refused
before it starts (`parallelism_config.CP_ON_CPU`). The model is sharded by FSDP2 over the flattened
("dp_shard", "cp") view (`parallelize/fsdp.py`, a step of `parallelize`); the ranks of one cp group read the same batch.
"""

from __future__ import annotations

import contextlib
import warnings

_warned = []


@contextlib.contextmanager
def maybe_context_parallel(state, buffers=None, buffer_seq_dims=None, no_restore_buffers=None):
    """Inside the block, `buffers` (inputs, labels, position buffers) hold this rank's part of their sequence
    dimension (`buffer_seq_dims`) and SDPA attends across the cp group; they are restored after, except those in
    `no_restore_buffers`. Without context parallelism: a one-time warning and nothing else (as in Accelerate)."""
    config = getattr(state, "parallelism_config", None)
    if config is None or not config.cp_enabled:
        if not _warned:
            _warned.append(True)
            warnings.warn("maybe_context_parallel does nothing: context parallelism is off (cp_size is 1)",
                          UserWarning, stacklevel=3)
        yield
        return
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method

    set_rotate_method(config.cp_handler.cp_comm_strategy)
    buffers = list(buffers or [])
    with context_parallel(config.submesh("cp"), buffers=buffers, buffer_seq_dims=list(buffer_seq_dims or []),
                          no_restore_buffers=set(no_restore_buffers or ())):
        yield


__all__ = ["maybe_context_parallel"]
