"""Issue 15's names on 2 real processes: test_launch, tqdm on the main process only, are_the_same_tensors,
standalone checkpoint functions (shared files once, RNG files per process) and the FSDP helper functions
(sharded and full state dicts round-trip, merge_fsdp_weights). Run by tests/utils/test_surface_distributed.py."""

import io
import os
import sys

import torch

from fsdp_common import fresh_accelerator, full_params, make_model, max_diff, train_steps
from hasten.checkpointing import save_accelerator_state, save_custom_state
from hasten.config.fsdp import FullyShardedDataParallelPlugin
from hasten.launchers import test_launch
from hasten.test_utils import are_the_same_tensors
from hasten.utils import (load_fsdp_model, load_fsdp_optimizer, merge_fsdp_weights, save_fsdp_model,
                          save_fsdp_optimizer, tqdm)

root = sys.argv[1]


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


acc = fresh_accelerator(cpu=True)
rank = acc.process_index
assert acc.num_processes == 2
assert test_launch().num_processes == 2

shown = not tqdm(range(3), file=FakeTerminal()).disable
assert shown == (rank == 0), (rank, shown)
assert not tqdm(range(3), file=FakeTerminal(), main_process_only=False).disable

assert are_the_same_tensors(torch.arange(4))
assert not are_the_same_tensors(torch.tensor([float(rank)]))

# standalone checkpoint functions: shared files once, one RNG file per process
folder = os.path.join(root, "standalone")
model = torch.nn.Linear(2, 2)
save_accelerator_state(folder, [model.state_dict()], [], [], [], process_index=rank, step=1)


class Counter:
    def state_dict(self):
        return {"rank": rank}


save_custom_state(Counter(), folder)
acc.wait_for_everyone()
names = sorted(os.listdir(folder))
assert names == ["custom_checkpoint_0.pkl", "model.safetensors", "random_states_0.pkl", "random_states_1.pkl"], names
assert torch.load(os.path.join(folder, "custom_checkpoint_0.pkl"), weights_only=True) == {"rank": 0}

# FSDP helper functions over hasten's FSDP checkpoint code
for kind in ("SHARDED_STATE_DICT", "FULL_STATE_DICT"):
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                            state_dict_type=kind)
    acc = fresh_accelerator(fsdp_plugin=plugin)

    def prepared(seed):
        model = make_model(seed)
        return acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=0.01))

    trained, optimizer = prepared(0)
    train_steps(acc, trained, optimizer, range(2))
    out = os.path.join(root, kind)
    save_fsdp_model(plugin, acc, trained, out)
    save_fsdp_optimizer(plugin, acc, optimizer, trained, out)
    acc.wait_for_everyone()
    expected = full_params(acc, trained)
    reference_losses = train_steps(acc, trained, optimizer, range(2, 4))

    fresh, fresh_opt = prepared(7)
    assert max_diff(full_params(acc, fresh), expected) > 0.0
    load_fsdp_model(plugin, acc, fresh, out)
    load_fsdp_optimizer(plugin, acc, fresh_opt, fresh, out)
    assert max_diff(full_params(acc, fresh), expected) == 0.0, kind
    resumed_losses = train_steps(acc, fresh, fresh_opt, range(2, 4))
    assert max(abs(a - b) for a, b in zip(resumed_losses, reference_losses)) < 1e-6, (kind, resumed_losses, reference_losses)

    if kind == "SHARDED_STATE_DICT":
        merged = merge_fsdp_weights(os.path.join(out, "pytorch_model_fsdp_0"), os.path.join(root, "merged"))
        from safetensors.torch import load_file

        loaded = load_file(merged)
        assert max_diff({k: v for k, v in loaded.items()}, expected) == 0.0
    acc.wait_for_everyone()

print(f"surface checks passed on rank {rank}")
