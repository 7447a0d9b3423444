"""Print the values this process's Accelerator really uses, and what the in-script explain says about them.

argv[1]: JSON of the values to pass in code ({"mixed_precision": "bf16", "dynamo_mode": "max-autotune", ...}).
"""

import json
import sys

from hasten import Accelerator
from hasten.config.handlers import TorchDynamoPlugin
from hasten.config.resolve import explain_values

code = json.loads(sys.argv[1])
kwargs = {k: v for k, v in code.items() if k in ("mixed_precision", "gradient_accumulation_steps", "cpu")}
plugin = {k: v for k, v in code.items() if k in ("dynamo_backend", "dynamo_mode")}
if plugin:
    kwargs["dynamo_plugin"] = TorchDynamoPlugin(backend=plugin.get("dynamo_backend"), mode=plugin.get("dynamo_mode"))
accelerator = Accelerator(**kwargs)
dynamo = accelerator.state.dynamo_plugin
used = {
    "mixed_precision": accelerator.mixed_precision,
    "dynamo_backend": dynamo.backend.value.lower(),
    "dynamo_mode": dynamo.mode,
    "debug": bool(accelerator.state.debug),
    "gradient_accumulation_steps": accelerator.gradient_accumulation_steps,
    "use_cpu": accelerator.device.type == "cpu",
}
explained = {name: [r.value, r.source] for name, r in explain_values(code=code).items() if name in used}
if accelerator.is_main_process:
    print("USED " + json.dumps(used))
    print("EXPLAINED " + json.dumps(explained))
