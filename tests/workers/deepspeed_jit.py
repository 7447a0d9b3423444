"""DeepSpeed's own AdamW (a C++ op compiled on first use) on CPU processes, allowed by HASTEN_DEEPSPEED_ALLOW_JIT=1:
it trains like torch's AdamW. Slow the first time on a machine (4-5 minutes of compiling); run by the `slow` group."""

from deepspeed_common import LR, loader, loss_of, make_model, max_difference, reference

from hasten import Accelerator, DeepSpeedPlugin
from hasten.utils import DummyOptim

CONFIG = {"train_micro_batch_size_per_gpu": "auto", "gradient_clipping": 1.0, "zero_optimization": {"stage": 2},
          "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}}}

accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=CONFIG))
model = make_model()
model, optimizer, data = accelerator.prepare(model, DummyOptim(model.parameters(), lr=LR, weight_decay=0.01), loader())
assert "torch.optim" not in type(optimizer.optimizer.optimizer).__module__, type(optimizer.optimizer.optimizer)
for step, (x, y) in enumerate(data):
    if step == 4:
        break
    accelerator.backward(loss_of(model, x, y))
    optimizer.step()
state = accelerator.get_state_dict(model)
if accelerator.is_main_process:
    difference = max_difference(state, reference(4, num_processes=2))
    assert difference < 1e-4, f"DeepSpeed's AdamW differs from torch's by {difference}"
print("OK jit_adamw", flush=True)
