"""An Accelerate training script, unchanged: it imports `accelerate` at the top, as transformers' `*_no_trainer`
examples do, and runs on hasten through `hasten alias install`. Prints `CHECKS-PASSED <rank> <count>`.

Usage: python -m hasten launch --num_processes 2 alias_no_trainer.py OUTPUT_DIR [--model tiny-mlp|tiny-gpt2]
"""

import argparse
import math
import os

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import ProjectConfiguration, set_seed

import hasten

logger = get_logger(__name__)
parser = argparse.ArgumentParser()
parser.add_argument("output_dir")
parser.add_argument("--model", default="tiny-mlp", choices=["tiny-mlp", "tiny-gpt2"])
args = parser.parse_args()

accelerator = Accelerator(gradient_accumulation_steps=2,
                          project_config=ProjectConfiguration(project_dir=args.output_dir))
set_seed(0)
rank, world = accelerator.process_index, accelerator.num_processes
checks = 0


def check(condition, what):
    global checks
    assert condition, f"rank {rank}: {what}"
    checks += 1


check(type(accelerator) is hasten.Accelerator, f"`from accelerate import Accelerator` gave {type(accelerator)}")
tokens = torch.tensor([[(row + step) % 16 for step in range(12)] for row in range(64)])
if args.model == "tiny-gpt2":
    from transformers import GPT2Config, GPT2LMHeadModel, get_scheduler

    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=16, n_positions=16,
                                       bos_token_id=0, eos_token_id=0))
else:
    get_scheduler = None

    class TinyLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(16, 32)
            self.out = torch.nn.Linear(32, 16)

        def forward(self, input_ids, labels=None):
            logits = self.out(torch.tanh(self.embed(input_ids)))
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 16), labels[:, 1:].reshape(-1))
            return type("Output", (), {"loss": loss, "logits": logits})

    model = TinyLM()
loader = torch.utils.data.DataLoader(
    [{"input_ids": row, "labels": row} for row in tokens], batch_size=4, shuffle=True)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
steps = math.ceil(len(loader) / world / 2)
scheduler = (get_scheduler("linear", optimizer=optimizer, num_warmup_steps=0, num_training_steps=steps)
             if get_scheduler else torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0))
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
check(len(loader) == math.ceil(64 / 4 / world), f"each rank sees 1/{world} of the batches: {len(loader)}")

losses = []
model.train()
for batch in loader:
    with accelerator.accumulate(model):
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    losses.append(accelerator.gather_for_metrics(loss.detach()[None]).mean().item())
    logger.info(f"loss {losses[-1]:.3f}", main_process_only=True)
check(losses[-1] < losses[0], f"the loss went down: {losses}")
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
everyone = accelerator.gather(flat[None])
check(torch.equal(everyone[0], everyone[-1]), "replicas differ after training")

saved = accelerator.save_state(os.path.join(args.output_dir, "state"))
check(os.path.isdir(saved) and any(name.startswith("model") for name in os.listdir(saved)), f"save_state: {saved}")
accelerator.save_model(model, os.path.join(args.output_dir, "final"))
accelerator.wait_for_everyone()
check(os.path.exists(os.path.join(args.output_dir, "final", "model.safetensors")), "save_model wrote safetensors")
accelerator.end_training()
print(f"CHECKS-PASSED {rank} {checks}", flush=True)
