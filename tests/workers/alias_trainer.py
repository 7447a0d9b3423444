"""transformers' Trainer through `hasten alias install`, on N processes: trains a tiny GPT-2 built from a config
(nothing downloaded) for a few steps and saves checkpoints. Prints `CHECKS-PASSED <rank> <count>`.

Usage: python -m hasten launch --num_processes 2 alias_trainer.py OUTPUT_DIR
"""

import json
import os
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import accelerate
import hasten

output_dir = sys.argv[1]
checks = 0


class TokenDataset(torch.utils.data.Dataset):
    """Sequences of a fixed repeating pattern, so the loss has something to learn."""

    def __len__(self):
        return 64

    def __getitem__(self, index):
        ids = torch.tensor([(index + step) % 16 for step in range(12)])
        return {"input_ids": ids, "labels": ids.clone()}


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=16, n_positions=16,
                                   bos_token_id=0, eos_token_id=0))
args = TrainingArguments(
    output_dir=output_dir, per_device_train_batch_size=4, max_steps=6, save_steps=3, logging_steps=1,
    learning_rate=1e-2, report_to=[], use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0,
)
trainer = Trainer(model=model, args=args, train_dataset=TokenDataset())
rank, world = trainer.args.process_index, trainer.args.world_size


def check(condition, what):
    global checks
    assert condition, f"rank {rank}: {what}"
    checks += 1


check(accelerate.Accelerator is hasten.Accelerator, "`import accelerate` gives hasten's names")
check(accelerate.__version__ == "1.15.0+hasten", f"accelerate.__version__ is {accelerate.__version__}")
check(isinstance(trainer.accelerator, hasten.Accelerator), f"Trainer built {type(trainer.accelerator)}")
check(world == int(os.environ["WORLD_SIZE"]) and trainer.accelerator.num_processes == world, "world size")
result = trainer.train()
check(trainer.state.global_step == 6, f"global_step {trainer.state.global_step}")
losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
check(len(losses) == 6 and all(loss == loss for loss in losses), f"losses {losses}")
check(losses[-1] < losses[0], f"the loss went down: {losses}")

# replicas stay identical: gradients were all-reduced by the DDP hasten set up
flat = torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])
everyone = trainer.accelerator.gather(flat[None])
check(torch.equal(everyone[0], everyone[-1]), "parameters differ across ranks")

trainer.accelerator.wait_for_everyone()
for step in (3, 6):
    folder = os.path.join(output_dir, f"checkpoint-{step}")
    files = set(os.listdir(folder))
    check({"model.safetensors", "optimizer.pt", "trainer_state.json"} <= files, f"{folder} holds {sorted(files)}")
    with open(os.path.join(folder, "trainer_state.json")) as handle:
        check(json.load(handle)["global_step"] == step, "trainer_state.json step")
reloaded = GPT2LMHeadModel.from_pretrained(os.path.join(output_dir, "checkpoint-6"))
check(all(torch.equal(a, b) for a, b in zip(reloaded.state_dict().values(),
                                            trainer.accelerator.unwrap_model(trainer.model).state_dict().values())),
      "the saved checkpoint holds the trained weights")
print(f"CHECKS-PASSED {rank} {checks}", flush=True)
