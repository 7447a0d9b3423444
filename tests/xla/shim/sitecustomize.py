"""Test-only fixes for two torch_xla 2.9 replicas on its CPU device (threads of one process), loaded through
PYTHONPATH by tests/xla when HASTEN_XLA_TEST_SHIM=1. Not part of hasten; a TPU needs neither fix.

1. torch_xla lowers CPU all-reduce / all-gather without a channel id, so the first collective of two replicas
   usually hangs (XLA aborts after ~10 s). Every all-gather here gets an explicit channel id from a per-thread
   counter (the replicas run the same collectives in the same order, so the ids agree), and all-reduce becomes
   an all-gather (the only collective whose binding takes a channel id) followed by the reduction.
2. `torch_xla.sync()` resets the all-reduce token holding the GIL and waits for the running execution, which
   waits for the other replica, which waits for the GIL. Waiting for this replica's own device after every
   sync (with more XLA threads) removes that cycle.
"""

import os

if os.environ.get("HASTEN_XLA_TEST_SHIM") == "1":
    os.environ.setdefault("XLA_THREAD_POOL_SIZE", "8")
    import threading

    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    _local = threading.local()
    _all_gather = xm.all_gather
    _sync = torch_xla.sync

    def _channel() -> int:
        _local.count = getattr(_local, "count", 0) + 1
        return _local.count

    def all_gather(value, dim=0, groups=None, output=None, pin_layout=True, channel_id=None,
                   use_global_device_ids=None):
        if channel_id is None and output is None and isinstance(value, torch.Tensor):
            # pin_layout=True would turn the gather into an all-reduce, which takes no channel id
            channel_id, use_global_device_ids, pin_layout = _channel(), False, False
        return _all_gather(value, dim, groups, output, pin_layout, channel_id, use_global_device_ids)

    _REDUCE = {
        xm.REDUCE_SUM: lambda t: t.sum(0), xm.REDUCE_MAX: lambda t: t.amax(0), xm.REDUCE_MIN: lambda t: t.amin(0),
        xm.REDUCE_MUL: lambda t: t.prod(0),
    }

    def all_reduce(reduce_type, inputs, scale=1.0, groups=None, pin_layout=True):
        single = isinstance(inputs, torch.Tensor)
        tensors = [inputs] if single else list(inputs)
        if xr.world_size() == 1:
            return inputs.clone() if single else inputs
        results = []
        for tensor in tensors:
            gathered = all_gather(tensor.reshape(1, -1), dim=0)
            reduced = _REDUCE[reduce_type](gathered)
            if scale != 1.0:
                reduced = reduced * scale
            results.append(reduced.reshape(tensor.shape).to(tensor.dtype))
        if single:
            return results[0]
        with torch.no_grad():
            for tensor, result in zip(tensors, results):
                tensor.copy_(result)
        return inputs

    def sync(wait=False, reset_scope=True):
        _sync(wait, reset_scope)
        xm.wait_device_ops(xm.xla_real_devices([str(torch_xla.device())]))

    xm.all_gather = all_gather
    xm.all_reduce = all_reduce
    torch_xla.sync = sync
