"""FSDP's offloads to CPU memory on a CPU run (2 processes), one `ok <check> rank <r>` line per check and rank.

Run by tests/backends/test_fsdp.py. cpu_offload (FSDP2 and FSDP1) is a no-op here: one warning, and training
gives the weights of the same run without it; FSDP2's activation_checkpointing_offload puts each checkpointed block
inside torch's offload wrapper, as Accelerate does, and trains to the same weights.
"""

import warnings

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import OffloadWrapper

from fsdp_common import fresh_accelerator, full_params, make_model, max_diff, train_steps
from hasten.config.fsdp import FullyShardedDataParallelPlugin


def run(**plugin_kwargs):
    """(whole weights after 3 steps, the offload warnings prepare gave, the prepared model)."""
    plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap", **plugin_kwargs)
    accelerator = fresh_accelerator(fsdp_plugin=plugin)
    model = make_model(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    said = [str(w.message) for w in caught if "trains on the CPU" in str(w.message)]
    train_steps(accelerator, model, optimizer, range(3))
    return full_params(accelerator, model), said, model


def ok(name):
    print(f"ok {name} rank {torch.distributed.get_rank()}", flush=True)


for version in (2, 1):
    kwargs = dict(fsdp_version=version) if version == 2 else dict(fsdp_version=1, use_orig_params=True)
    plain, said, _ = run(**kwargs)
    assert not said, said
    offloaded, said, _ = run(cpu_offload=True, **kwargs)
    assert len(said) == 1 and "fsdp cpu_offload" in said[0], said
    assert max_diff(plain, offloaded) == 0.0, max_diff(plain, offloaded)
    ok(f"cpu_offload_fsdp{version}")

checkpointed, _, _ = run(fsdp_version=2, activation_checkpointing=True)
offloaded, said, model = run(fsdp_version=2, activation_checkpointing=True, activation_checkpointing_offload=True)
wrappers = [m for m in model.modules() if isinstance(m, OffloadWrapper)]
assert len(wrappers) == 3 and not said, (len(wrappers), said)
assert max_diff(checkpointed, offloaded) == 0.0, max_diff(checkpointed, offloaded)
ok("activation_offload")

# hasten's strict setting refuses the no-op offload in one line
import os  # noqa: E402

from hasten.core.errors import ConfigError  # noqa: E402

os.environ["HASTEN_STRICT"] = "1"
try:
    run(fsdp_version=2, cpu_offload=True)
except ConfigError as error:
    assert "already the CPU" in str(error) and "strict" in str(error) and "\n" not in str(error), str(error)
else:
    raise AssertionError("cpu_offload on a CPU run under strict was not refused")
ok("strict")
