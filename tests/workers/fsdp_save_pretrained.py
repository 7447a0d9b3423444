"""`save_pretrained` of a transformers model after FSDP2 training (Accelerate's torch_native_parallelism
`nd_parallel.py --dp-shard-size 2`, shrunk: a tiny Llama from a config, bf16, SGD, a few steps).

Run by tests/backends/test_fsdp.py on 2 processes. `argv[1]`: a scratch folder shared by the ranks; `argv[2]`:
"tied" ties the embedding and the output head. Prints `ok <route> rank <r>` per route that saved the trained
weights: `plain` (`model.save_pretrained(dir)`, as the example) and `explicit` (`unwrap_model(model)
.save_pretrained(dir, state_dict=accelerator.get_state_dict(model))`).
"""

import os
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hasten import Accelerator
from hasten.parallelism_config import ParallelismConfig
from hasten.utils import FullyShardedDataParallelPlugin, set_seed

root, tied = sys.argv[1], sys.argv[2] == "tied"
set_seed(42)
plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                        transformer_cls_names_to_wrap=["LlamaDecoderLayer"],
                                        state_dict_type="SHARDED_STATE_DICT")
accelerator = Accelerator(mixed_precision="bf16", parallelism_config=ParallelismConfig(dp_shard_size=2),
                          fsdp_plugin=plugin)
config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=64, use_cache=False, tie_word_embeddings=tied)
model = LlamaForCausalLM(config).to(torch.bfloat16)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
model, optimizer = accelerator.prepare(model, optimizer)
before = accelerator.get_state_dict(model)
for step in range(3):
    ids = torch.randint(0, 64, (1, 16))
    loss = model(input_ids=ids, labels=ids, position_ids=torch.arange(16).unsqueeze(0)).loss
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)
trained = accelerator.get_state_dict(model)  # the whole weights on the main process, {} elsewhere

routes = {"plain": lambda folder: model.save_pretrained(folder),
          "explicit": lambda folder: accelerator.unwrap_model(model).save_pretrained(
              folder, state_dict=accelerator.get_state_dict(model))}
for route, save in routes.items():
    folder = os.path.join(root, route)
    save(folder)  # every rank calls it, as the example does
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        reloaded = LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).state_dict()
        assert set(reloaded) == set(trained), sorted(set(reloaded) ^ set(trained))
        for name, value in trained.items():
            assert torch.equal(reloaded[name], value.float()), name
        assert not torch.equal(trained["model.norm.weight"], before["model.norm.weight"]), "did not train"
        if tied:
            assert reloaded["lm_head.weight"].data_ptr() == reloaded["model.embed_tokens.weight"].data_ptr()
    print(f"ok {route} rank {accelerator.process_index}", flush=True)
