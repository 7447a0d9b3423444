"""hasten's Ulysses sequence parallelism on 2 processes (sp_size 2, sp_backend hasten, from the config file's
`parallelism_config:` block), launched by tests/distributed/test_sequence_parallel.py.

- a tiny Llama trained 5 steps with sp=2 (DDP over the two sp ranks) equals one process on whole sequences;
- variable-length sequences (odd lengths: padded to a multiple of sp), with eager attention, equal it too;
- save_state after 3 steps, continue 2; a new Accelerator loading the checkpoint continues identically;
- a model whose key/value heads do not divide by sp_size is refused in one line.
Writes <folder>/result.json on rank 0. Usage: sp_train.py <folder>
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from sp_common import (
    LR,
    STEPS,
    fresh_accelerator,
    loader,
    make_model,
    max_diff,
    reference,
    samples,
    train_steps,
    whole,
)

from hasten.core.errors import ConfigError

TOL = 1e-5
folder = sys.argv[1]
assert os.environ.get("PARALLELISM_CONFIG_SP_SIZE") == "2", "the config file's block did not reach the process"
result = {}


def run(data, steps=STEPS, project_dir=None, attn="sdpa"):
    acc = fresh_accelerator(project_dir=project_dir)
    config = acc.parallelism_config
    assert config is not None and config.sp_size == 2 and config.sp_backend == "hasten", config
    assert acc.torch_device_mesh.mesh_dim_names == ("sp",)
    model = make_model(attn=attn)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    model, opt, dl = acc.prepare(model, opt, loader(data))
    assert model.module.config._attn_implementation == f"hasten_ulysses:{attn}"
    return acc, model, opt, dl


# -- fixed length: sp=2 equals one process ----------------------------------------------------------------------
data = samples(STEPS * 2, variable=False)
want_losses, want = reference(data, dp=1)
acc, model, opt, dl = run(data)
first = next(iter(dl))
assert first["input_ids"].shape == (2, 6), first["input_ids"].shape  # this rank's half of 12 tokens
assert first["position_ids"][0, 0].item() == 6 * acc.process_index  # positions of the whole sequence
losses = train_steps(acc, model, opt, dl, STEPS)
result["fixed"] = {"loss": max(abs(a - b) for a, b in zip(losses, want_losses)),
                   "weights": max_diff(whole(acc.unwrap_model(model).state_dict()), want)}

# -- variable length, padded to a multiple of sp (eager attention: the wrapper's whole-sequence causal mask) ------
data = samples(STEPS * 2, variable=True)
want_losses, want = reference(data, dp=1, attn="eager")
acc, model, opt, dl = run(data, attn="eager")
lengths = [b["input_ids"].shape[1] for b in dl]
longest = [max(len(x) for x in data[i:i + 2]) for i in range(0, 2 * STEPS, 2)]
assert any(2 * n != m for n, m in zip(lengths, longest)), "no batch needed padding: the test would not show it"
losses = train_steps(acc, model, opt, dl, STEPS)
result["variable"] = {"loss": max(abs(a - b) for a, b in zip(losses, want_losses)),
                      "weights": max_diff(whole(acc.unwrap_model(model).state_dict()), want)}

# -- save -> load -> the same continuation ------------------------------------------------------------------------
data = samples(STEPS * 2, variable=True, seed=11)
ckpt = os.path.join(folder, "ckpt")
acc, model, opt, dl = run(data, project_dir=folder)
batches = iter(dl)
train_steps(acc, model, opt, batches, 3)
acc.save_state(ckpt)
after = train_steps(acc, model, opt, batches, 2)
weights = whole(acc.unwrap_model(model).state_dict())
acc, model, opt, dl = run(data, project_dir=folder)
acc.load_state(ckpt)
batches = iter(dl)
for _ in range(3):
    next(batches)
again = train_steps(acc, model, opt, batches, 2)
result["resume"] = {"loss": max(abs(a - b) for a, b in zip(after, again)),
                    "weights": max_diff(whole(acc.unwrap_model(model).state_dict()), weights)}

# -- key/value heads that do not divide by sp_size --------------------------------------------------------------
acc = fresh_accelerator()
model = acc.prepare(make_model(kv_heads=1))
try:
    model(input_ids=torch.ones(1, 4, dtype=torch.long), position_ids=torch.arange(4)[None])
except ConfigError as error:
    result["heads_error"] = str(error)

for name in ("fixed", "variable", "resume"):
    assert result[name]["loss"] <= TOL and result[name]["weights"] <= TOL, (name, result[name])
if dist.get_rank() == 0:
    with open(os.path.join(folder, "result.json"), "w") as f:
        json.dump(result, f)
print("sp_train ok", json.dumps(result))
