"""Accelerate's FSDP2 helper functions on 2 processes: fsdp2_apply_ac, fsdp2_prepare_model,
fsdp2_load_full_state_dict; prepare() under activation_checkpointing (Accelerate's parameter names) and its
checkpoints loading with and without it. Run by tests/utils/test_surface_leftovers.py (argv[1]: a shared folder)."""

import torch
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from fsdp_common import DIM, Net, fresh_accelerator, make_model
from hasten.config.fsdp import FullyShardedDataParallelPlugin
from hasten.utils import fsdp2_apply_ac, fsdp2_load_full_state_dict, fsdp2_prepare_model

CKPT = "_checkpoint_wrapped_module."


def whole(model) -> dict:
    """Every parameter and buffer, whole, on every process (collective)."""
    out = {}
    for name, tensor in model.state_dict().items():
        out[name] = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
    return out


accelerator = fresh_accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(
    fsdp_version=2, auto_wrap_policy="transformer_based_wrap"))
rank = accelerator.process_index

# -- fsdp2_apply_ac, then fsdp2_prepare_model -------------------------------------------------------------
model = make_model()
expected = {k: v.clone() for k, v in model.state_dict().items()}
names = [name for name, _ in model.named_parameters()]
assert fsdp2_apply_ac(accelerator, model) is model
# As in Accelerate: each block inside torch's CheckpointWrapper, which shows in the parameter names (not the keys).
wrapped_names = [name for name, _ in model.named_parameters()]
assert [name.replace(CKPT, "") for name in wrapped_names] == names, wrapped_names
assert all(CKPT in name for name in wrapped_names if name.startswith("blocks.")), wrapped_names
assert list(model.state_dict()) == list(expected), "activation checkpointing changed the state_dict keys"
prepared = fsdp2_prepare_model(accelerator, model)
assert prepared is model and isinstance(model, FSDPModule)
assert all(isinstance(block._checkpoint_wrapped_module, FSDPModule) for block in model.blocks), "each Block is a unit"
assert all(isinstance(p, DTensor) for p in model.parameters())
assert all(p.to_local().numel() < p.numel() for p in model.blocks[0].parameters() if p.numel() >= 2)
assert fsdp2_prepare_model(accelerator, model) is model  # already sharded: returned as is
got = whole(model)
assert all(torch.equal(got[k], expected[k]) for k in expected), "sharding changed the weights"

calls = []
model.blocks[0].linear.register_forward_hook(lambda *args: calls.append(1))
x = torch.randn(4, DIM)
model(x).sum().backward()
assert len(calls) == 2, f"a checkpointed block runs forward again in backward; ran {len(calls)} times"
assert all(p.grad is not None for p in model.parameters())

# -- fsdp2_load_full_state_dict: rank 0 holds the weights, everyone built on meta ---------------------------
source = make_model(seed=3)
full = {k: v.clone() for k, v in source.state_dict().items()} if rank == 0 else {}
kept = {k: v.clone() for k, v in full.items()}
with torch.device("meta"):
    empty = Net()
for block in empty.blocks:
    fully_shard(block)
fully_shard(empty)
fsdp2_load_full_state_dict(accelerator, empty, full)
assert not any(t.is_meta for t in empty.state_dict().values())
loaded = whole(empty)
reference = source.state_dict()
assert all(torch.equal(loaded[k], reference[k]) for k in reference), "rank 0's weights did not arrive everywhere"
assert all(torch.equal(full[k], kept[k]) for k in kept), "the caller's state dict was changed"
assert torch.allclose(empty(x), source(x), atol=1e-6)

accelerator.wait_for_everyone()
print(f"fsdp2 functions ok on rank {rank}")

# -- prepare() and a model dispatched over several devices (HASTEN_BYPASS_DEVICE_MAP) ----------------------
import os  # noqa: E402

from hasten.core.errors import ConfigError  # noqa: E402

dispatched = make_model()
dispatched.hf_device_map = {"inp": "cpu", "blocks": "disk"}
try:
    accelerator.prepare(dispatched)
    raise AssertionError("a dispatched model was prepared in a distributed run")
except ConfigError as error:
    assert "BYPASS_DEVICE_MAP" in str(error)
os.environ["ACCELERATE_BYPASS_DEVICE_MAP"] = "true"  # Accelerate's spelling works too
accelerator.prepare(dispatched)  # taken as it is: its hooks place the weights
del os.environ["ACCELERATE_BYPASS_DEVICE_MAP"]

accelerator.wait_for_everyone()
print(f"bypass device map ok on rank {rank}")

# -- prepare() under activation_checkpointing: Accelerate's names; checkpoints load with and without it ------------
import sys  # noqa: E402

root = sys.argv[1]


def ac_plugin(on):
    return FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                          activation_checkpointing=on)


def prepared_pair(on, seed):
    acc = fresh_accelerator(fsdp_plugin=ac_plugin(on))
    net = make_model(seed=seed)
    return (acc, *acc.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)))


acc, net, opt = prepared_pair(True, seed=5)
assert any(CKPT in name for name, _ in net.named_parameters()), "prepare() did not apply fsdp2_apply_ac"
assert not any(CKPT in key for key in net.state_dict())
x = torch.randn(4, DIM)
acc.backward(net(x).sum())
opt.step()
opt.zero_grad()
saved = whole(net)
acc.save_state(f"{root}/with_ac")
for on, folder, seed in ((False, "with_ac", 6), (True, "without_ac", 7)):
    acc, net, opt = prepared_pair(on, seed)
    acc.load_state(f"{root}/{folder}")
    got = whole(net)
    assert all(torch.equal(got[k], saved[k]) for k in saved), f"checkpoint {folder} did not load (ac={on})"
    assert opt.state_dict()["state"], "optimizer state did not load"
    if not on:
        acc.save_state(f"{root}/without_ac")
accelerator.wait_for_everyone()
print(f"activation checkpointing names ok on rank {rank}")

# -- regional compilation through prepare(), as Accelerate per backend --------------------------------------------
from hasten import TorchDynamoPlugin  # noqa: E402


def regional():
    return TorchDynamoPlugin(backend="eager", use_regional_compilation=True)


acc = fresh_accelerator(fsdp_plugin=ac_plugin(False), dynamo_plugin=regional())
net = make_model()
assert acc.prepare(net) is net, "FSDP2: regions are compiled in place"
assert all(block._compiled_call_impl is not None for block in net.blocks)
net(torch.randn(4, DIM)).sum().backward()

acc = fresh_accelerator(dynamo_plugin=regional())  # DDP: compile_regions' new tree
net = make_model()
prepared = acc.prepare(net)
assert prepared is not net and type(prepared).__name__ == "DistributedDataParallel", type(prepared)
assert "module.blocks.0._orig_mod.linear.weight" in prepared.state_dict(), list(prepared.state_dict())[:4]
acc.backward(prepared(torch.randn(4, DIM)).sum())
grad = net.inp.weight.grad.clone()
others = [torch.empty_like(grad) for _ in range(2)]
torch.distributed.all_gather(others, grad)
assert torch.equal(others[0], others[1]), "DDP's gradient hooks did not run through the compiled tree"
assert acc.unwrap_model(prepared, keep_torch_compile=False) is net
accelerator.wait_for_everyone()
print(f"regional compilation ok on rank {rank}")
