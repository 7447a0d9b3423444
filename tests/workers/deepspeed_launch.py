"""Launched with DeepSpeed settings from flags and a config file: the script's plain Accelerator() sees them.

    deepspeed_launch.py STAGE CLIPPING STEPS
"""

import sys

from hasten import Accelerator, DistributedType

stage, clipping, steps = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
accelerator = Accelerator()  # no plugin in code: the launcher's variables make one
plugin = accelerator.deepspeed_plugin
assert accelerator.distributed_type == DistributedType.DEEPSPEED and accelerator.num_processes == 2
assert (plugin.zero_stage, plugin.gradient_clipping) == (stage, clipping), (plugin.zero_stage, plugin.gradient_clipping)
assert accelerator.gradient_accumulation_steps == steps == plugin.deepspeed_config["gradient_accumulation_steps"]
assert accelerator.mixed_precision == "bf16" and plugin.deepspeed_config["bf16"]["enabled"] is True
print(f"OK launch rank {accelerator.process_index} main={accelerator.is_main_process}", flush=True)
