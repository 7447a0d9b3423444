"""peft's FSDP auto-wrap policy through `hasten alias install`, on N processes under `--use_fsdp`: a tiny GPT-2
(built from a config, nothing downloaded) with LoRA adapters is wrapped by the policy peft builds from
`accelerate`'s names, and trains a few steps. Prints `CHECKS-PASSED <rank> <count>`.

Usage: python -m hasten launch --use_fsdp --fsdp_version 1 --num_processes 2 alias_peft_fsdp.py
"""

import torch
from accelerate import Accelerator
from accelerate.utils import FullyShardedDataParallelPlugin
from checks import Checks
from peft import LoraConfig, get_peft_model
from peft.utils.other import fsdp_auto_wrap_policy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from transformers import GPT2Config, GPT2LMHeadModel

import hasten

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=16, n_positions=16,
                                   bos_token_id=0, eos_token_id=0))
model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True))
policy = fsdp_auto_wrap_policy(model)  # reads FullyShardedDataParallelPlugin.get_module_class_from_name
accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(auto_wrap_policy=policy, use_orig_params=True))
rank = accelerator.process_index
check = Checks(rank)

check(type(accelerator) is hasten.Accelerator, f"`from accelerate import Accelerator` gave {type(accelerator)}")
check(FullyShardedDataParallelPlugin is hasten.utils.FullyShardedDataParallelPlugin, "the plugin is hasten's")
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
model, optimizer = accelerator.prepare(model, optimizer)
wrapped = [type(m.module).__name__ for m in model.modules() if isinstance(m, FSDP)]
check(isinstance(model, FSDP), f"prepare() gave {type(model)}")
check(wrapped.count("GPT2Block") == 2, f"each GPT2Block is an FSDP unit (the policy's transformer rule): {wrapped}")
check(any(name in ("Linear", "Embedding") for name in wrapped), f"the trainable LoRA leaves are wrapped: {wrapped}")
ids = torch.tensor([[(row + step) % 16 for step in range(12)] for row in range(8)])
losses = []
for _ in range(4):
    loss = model(input_ids=ids, labels=ids).loss
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    losses.append(loss.item())
check(all(loss == loss for loss in losses) and losses[-1] < losses[0], f"the loss went down: {losses}")
check.done()
