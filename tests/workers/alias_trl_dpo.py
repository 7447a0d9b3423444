"""trl's DPOTrainer through `hasten alias install`, on N processes: a tiny GPT-2 and a word-level tokenizer
built in code (nothing downloaded) take DPO steps on a few preference pairs. Prints `CHECKS-PASSED <rank> <n>`.

Usage: python -m hasten launch --num_processes 2 alias_trl_dpo.py OUTPUT_DIR
"""

import copy
import sys

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
from trl import DPOConfig, DPOTrainer

import accelerate
import hasten

words = ["<pad>", "<eos>", "the", "sky", "is", "blue", "green", "grass", "red", "what", "colour", "?"]
tokenizer = PreTrainedTokenizerFast(
    tokenizer_object=Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>")),
    pad_token="<pad>", eos_token="<eos>")
tokenizer._tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
pairs = {"prompt": ["what colour is the sky ?", "what colour is the grass ?"] * 4,
         "chosen": [" blue", " green"] * 4, "rejected": [" red", " red"] * 4}
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=len(words), n_positions=32,
                                   bos_token_id=1, eos_token_id=1, pad_token_id=0))
args = DPOConfig(output_dir=sys.argv[1], per_device_train_batch_size=2, max_steps=2, learning_rate=1e-3,
                 report_to=[], use_cpu=True, disable_tqdm=True, logging_steps=1, save_strategy="no", seed=0,
                 dataloader_num_workers=0)
# the frozen reference is passed in: without one trl reloads the policy by name from the Hub
trainer = DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=args, train_dataset=Dataset.from_dict(pairs),
                     processing_class=tokenizer)
rank = trainer.args.process_index
checks = 0


def check(condition, what):
    global checks
    assert condition, f"rank {rank}: {what}"
    checks += 1


check(accelerate.Accelerator is hasten.Accelerator, "`import accelerate` gives hasten's names")
check(isinstance(trainer.accelerator, hasten.Accelerator), f"DPOTrainer built {type(trainer.accelerator)}")
check(trainer.accelerator.num_processes == trainer.args.world_size == 2, "two processes")
trainer.train()
check(trainer.state.global_step == 2, f"global_step {trainer.state.global_step}")
losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
check(len(losses) == 2 and all(loss == loss for loss in losses), f"DPO losses {losses}")
flat = torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])
gathered = trainer.accelerator.gather(flat[None])
check(torch.equal(gathered[0], gathered[1]), "the replicas hold identical weights after the DPO steps")
print(f"CHECKS-PASSED {rank} {checks}", flush=True)
