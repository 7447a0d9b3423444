"""The names Accelerate's own tests patch on the FSDP2 path are the code `prepare` runs (2 processes):
`Accelerator._prepare_fsdp2`, `Accelerator._get_named_parameters`, `hasten.accelerator.fsdp2_prepare_model` and
`fsdp2_canonicalize_names`, and `hasten.utils.fsdp_utils.is_compiled_module` / `fsdp2_prepare_auto_wrap_policy`.
Also Accelerate's fp32 master weights under mixed precision (a bf16 Linear beside an fp32 LayerNorm shards).
Run by tests/backends/test_fsdp.py."""

from unittest import mock

import torch
from torch.distributed.fsdp import FSDPModule

import hasten.accelerator
import hasten.utils.fsdp_utils as fsdp_utils
from fsdp_common import fresh_accelerator, make_model, train_steps
from hasten.config.fsdp import FullyShardedDataParallelPlugin


def plugin():
    return FullyShardedDataParallelPlugin(fsdp_version=2)  # no wrap policy: only the root is a unit


# -- prepare() goes through _prepare_fsdp2, which calls the module's helpers and _get_named_parameters twice ---------
accelerator = fresh_accelerator(fsdp_plugin=plugin(), mixed_precision="bf16")
rank = accelerator.process_index
model = make_model()
model.inp.to(torch.bfloat16)  # as transformers loads a bf16 checkpoint beside fp32 norms
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
real_prepare = hasten.accelerator.fsdp2_prepare_model  # loaded on first use, as Accelerate's module global
with mock.patch.object(accelerator, "_prepare_fsdp2", wraps=accelerator._prepare_fsdp2) as step, \
        mock.patch.object(accelerator, "_get_named_parameters", wraps=accelerator._get_named_parameters) as names, \
        mock.patch("hasten.accelerator.fsdp2_prepare_model", wraps=real_prepare) as shard, \
        mock.patch("hasten.utils.fsdp_utils.fsdp2_prepare_auto_wrap_policy",
                   return_value=lambda module: isinstance(module, torch.nn.Linear)) as policy, \
        mock.patch("hasten.utils.fsdp_utils.is_compiled_module", wraps=fsdp_utils.is_compiled_module) as compiled:
    model, optimizer = accelerator.prepare(model, optimizer)
assert step.call_count == 1 and names.call_count == 2 and shard.call_count == 1, (step, names, shard)
assert policy.call_count == 1 and compiled.call_count >= 1
# the patched policy, not the plugin's (no wrap), chose the units
assert isinstance(model.inp, FSDPModule) and isinstance(model.blocks[0].linear, FSDPModule)
assert not isinstance(model.blocks[0], FSDPModule)
# mixed precision keeps fp32 master weights, as Accelerate: the bf16 Linear was upcast before sharding
assert {p.dtype for p in model.parameters()} == {torch.float32}
before = {n: p.full_tensor().clone() for n, p in model.named_parameters()}
losses = train_steps(accelerator, model, optimizer, range(2))
assert all(loss == loss for loss in losses)
changed = [n for n, p in model.named_parameters() if not torch.equal(p.full_tensor(), before[n])]
assert len(changed) == len(before), f"the optimizer did not update the sharded parameters: {changed}"

# -- a parameter lost on the way is Accelerate's KeyError (the check really runs on the names it is given) ----------
accelerator = fresh_accelerator(fsdp_plugin=plugin())
model = make_model()
dropped = lambda named: {n: p for n, p in named.items() if n != "out.bias"}  # noqa: E731
seen = []
with mock.patch("hasten.accelerator.fsdp2_canonicalize_names",
                side_effect=lambda named: (seen.append(1), named if len(seen) == 1 else dropped(named))[1]):
    try:
        accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    except KeyError as error:
        assert "Parameters missing after FSDP2 wrapping" in str(error) and "out.bias" in str(error), error
    else:
        raise AssertionError("a parameter missing after sharding was not reported")
print(f"fsdp2 patched names ok rank {rank}", flush=True)
