"""`save_fsdp_model` / `load_fsdp_model` with `adapter_only=True` through `hasten alias install`, on 2 processes under
FSDP2: a tiny GPT-2 (built from a config) with LoRA adapters trains a step, saves only its adapter (whole and
sharded state dicts), and a fresh PEFT model (other adapter weights) loads it back to identical adapter weights
while its base weights stay its own. Prints `CHECKS-PASSED <rank> <count>`.

Usage: python -m hasten launch --use_fsdp --fsdp_version 2 --num_processes 2 alias_peft_adapter_only.py <folder>
"""

import os
import sys

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import load_fsdp_model, save_fsdp_model
from checks import Checks
from peft import LoraConfig, get_peft_model
from torch.distributed.tensor import DTensor
from transformers import GPT2Config, GPT2LMHeadModel

folder = sys.argv[1]
accelerator = Accelerator()
plugin = accelerator.state.fsdp_plugin
rank = accelerator.process_index
check = Checks(rank)


def peft_model(seed):
    torch.manual_seed(seed)
    base = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=16, n_positions=16,
                                      bos_token_id=0, eos_token_id=0))
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True, init_lora_weights=False)
    return get_peft_model(base, lora)


def whole(model, adapter: bool) -> dict:
    """name -> full tensor of the adapter's (or the base's) parameters, on every rank."""
    return {name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
            for name, p in model.named_parameters() if ("lora_" in name) == adapter}


model = peft_model(0)
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
model, optimizer = accelerator.prepare(model, optimizer)
ids = torch.tensor([[(row + step) % 16 for step in range(12)] for row in range(4)])
accelerator.backward(model(input_ids=ids, labels=ids).loss)
optimizer.step()
saved = whole(model, adapter=True)
check(len(saved) == 4, f"two LoRA pairs: {sorted(saved)}")

for kind in ("FULL_STATE_DICT", "SHARDED_STATE_DICT"):
    plugin.set_state_dict_type(kind)
    out = os.path.join(folder, kind)
    save_fsdp_model(plugin, accelerator, model, out, adapter_only=True)
    accelerator.wait_for_everyone()
    if kind == "FULL_STATE_DICT":
        keys = set(torch.load(os.path.join(out, "pytorch_model_fsdp.bin"), weights_only=True))
        check(keys == set(saved), f"the file holds the adapter's parameters only: {sorted(keys)}")
    else:
        from torch.distributed.checkpoint import FileSystemReader

        keys = set(FileSystemReader(os.path.join(out, "pytorch_model_fsdp_0")).read_metadata().state_dict_metadata)
        check(keys and all("lora_" in key for key in keys), f"the DCP folder holds adapter keys only: {sorted(keys)}")
        check(len(keys) == len(saved), f"every adapter tensor is in the DCP folder: {sorted(keys)}")

    fresh = accelerator.prepare(peft_model(1))  # other adapter and base weights
    base_before = whole(fresh, adapter=False)
    before = whole(fresh, adapter=True)
    check(any(not torch.equal(before[n], saved[n]) for n in saved), "the fresh adapter starts different")
    load_fsdp_model(plugin, accelerator, fresh, out, adapter_only=True)
    loaded = whole(fresh, adapter=True)
    differ = {n: (loaded[n] - saved[n]).abs().max().item() for n in saved if not torch.equal(loaded[n], saved[n])}
    check(not differ, f"{kind}: the adapter weights are identical; these differ (max abs difference): {differ}")
    base_after = whole(fresh, adapter=False)
    changed = {n: (base_after[n] - base_before[n]).abs().max().item() for n in base_before
               if not torch.equal(base_after[n], base_before[n])}
    check(not changed, f"{kind}: the base is untouched; these changed (max abs difference): {changed}")

dist.barrier()
check.done()
