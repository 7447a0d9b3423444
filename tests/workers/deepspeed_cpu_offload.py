"""DeepSpeed CPU offload on a CPU run (the configs of Accelerate's `test_ds_multiple_model.py`: ZeRO-2 with
`offload_optimizer` on the CPU trains, ZeRO-3 with both offloads is a second model). Run by
tests/backends/test_deepspeed.py on 2 processes; prints `OK <check>` per check.

On a CPU run the offload is a no-op: one warning, and the engine trains as the reference says.
"""

import warnings

import torch
from deepspeed_common import LR, PER_PROCESS, loader, loss_of, make_model, max_difference, reference

from hasten import Accelerator, DeepSpeedPlugin

STEPS = 4
OFFLOAD = {"device": "cpu", "pin_memory": True}
ZERO2 = {"bf16": {"enabled": "auto"}, "gradient_clipping": "auto", "train_batch_size": "auto",
         "train_micro_batch_size_per_gpu": "auto",
         "zero_optimization": {"stage": 2, "offload_optimizer": dict(OFFLOAD), "overlap_comm": True}}
ZERO3 = {"bf16": {"enabled": "auto"}, "train_micro_batch_size_per_gpu": PER_PROCESS, "gradient_clipping": 1.0,
         "zero_optimization": {"stage": 3, "offload_optimizer": dict(OFFLOAD), "offload_param": dict(OFFLOAD)}}

plugins = {"training": DeepSpeedPlugin(hf_ds_config=ZERO2), "inference": DeepSpeedPlugin(hf_ds_config=ZERO3)}
accelerator = Accelerator(deepspeed_plugins=plugins)
models, optimizers, said = {}, {}, {}
for name, seed in (("training", 0), ("inference", 1)):
    accelerator.state.select_deepspeed_plugin(name)
    model = make_model(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if name == "training":
            model, optimizer, data = accelerator.prepare(model, optimizer, loader())
        else:
            model, optimizer = accelerator.prepare(model, optimizer)
    said[name] = [str(w.message) for w in caught if "trains on the CPU" in str(w.message)]
    models[name], optimizers[name] = model, optimizer
assert len(said["training"]) == 1 and "offload_optimizer_device 'cpu'" in said["training"][0], said
assert len(said["inference"]) == 1 and "offload_param_device 'cpu'" in said["inference"][0], said
# the plugins keep the user's config; DeepSpeed got it without the offload sections
assert plugins["training"].deepspeed_config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
assert "offload_optimizer" not in models["training"].config["zero_optimization"], models["training"].config
print("OK warned", flush=True)

for step, (x, y) in enumerate(data):
    if step == STEPS:
        break
    for name in ("training", "inference"):
        model, optimizer = models[name], optimizers[name]
        accelerator.backward(loss_of(model, x, y))
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
for name, seed in (("training", 0), ("inference", 1)):
    accelerator.state.select_deepspeed_plugin(name)
    state = accelerator.get_state_dict(models[name])
    if accelerator.is_main_process:
        difference = max_difference(state, reference(STEPS, num_processes=2, seed=seed))
        assert difference < 1e-5, f"{name} differs from its reference by {difference}"
print("OK trains", flush=True)
