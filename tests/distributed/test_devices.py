"""Every device Accelerate 1.15 names besides CUDA and XLA, each simulated by a stand-in for its torch module in a
fresh process (a vendor package such as torch_mlu registers `torch.mlu`; the stand-in does the same): detected as
Accelerate detects it, with its process-group backend and distributed type, its RNG seeded, its cache emptied, and
mixed precision refused in one line naming the device where this torch has no autocast for it. Never the CPU."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hasten.distributed import cluster

# device -> (package that brings it, process-group backend, distributed type)
DEVICES = {
    "mlu": ("torch_mlu", "cncl", "MULTI_MLU"),
    "sdaa": ("torch_sdaa", "tccl", "MULTI_SDAA"),
    "musa": ("torch_musa", "mccl", "MULTI_MUSA"),
    "npu": ("torch_npu", "hccl", "MULTI_NPU"),
    "hpu": ("habana_frameworks.torch", "hccl", "MULTI_HPU"),
    "neuron": ("torch_neuronx", "neuron", "MULTI_NEURON"),
    "xpu": (None, "xccl", "MULTI_XPU"),
    "mps": (None, "gloo", "MULTI_CPU"),
}

STAND_IN = '''
import sys, types, torch
NAME = {name!r}
if NAME not in ("hpu", "xpu", "mps"):  # torch has no such device type of its own: the vendor package renames one
    torch.utils.rename_privateuse1_backend(NAME)
calls = {{"seed": None, "empty_cache": 0, "set_device": None}}
# xpu and mps are torch's own modules: patched in place (torch reaches inside them)
module = getattr(torch, NAME) if NAME in ("xpu", "mps") else types.ModuleType("torch." + NAME)
module.calls = calls
module.is_available = lambda: True
module.device_count = lambda: 2
module.current_device = lambda: 0
module.set_device = lambda device: calls.__setitem__("set_device", str(device))
module.manual_seed_all = lambda seed: calls.__setitem__("seed", seed)
module.get_rng_state_all = lambda: [torch.zeros(8, dtype=torch.uint8)]
module.set_rng_state_all = lambda states: None
module.empty_cache = lambda: calls.__setitem__("empty_cache", calls["empty_cache"] + 1)
if NAME == "mps":
    torch.backends.mps.is_available = lambda: True
    torch.backends.mps.is_built = lambda: True
if NAME not in ("xpu", "mps"):
    setattr(torch, NAME, module)
    sys.modules["torch." + NAME] = module
'''

PROBE = '''
import json, os, torch
{activate}
from hasten.state import PartialState
from hasten.distributed import cluster
from hasten.utils import set_seed
from hasten.utils.memory import clear_device_cache
state = PartialState()
module = getattr(torch, {name!r})
set_seed(7)
clear_device_cache()
try:
    from hasten.training.precision import PrecisionPolicy
    PrecisionPolicy.from_setting("bf16", state.device)
    autocast = "ok"
except Exception as error:
    autocast = f"{{type(error).__name__}}: {{error}}"
print(json.dumps({{"device": str(state.device), "type": state.distributed_type.value,
                  "backend": cluster.choose_backend(state.device.type),
                  "multi": cluster.distributed_type_for(state.device.type, 2, True).value,
                  "calls": getattr(module, "calls", {{}}), "autocast": autocast}}))
'''


def _simulate(tmp_path: Path, name: str) -> dict:
    package = DEVICES[name][0]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "HASTEN_USE_CPU",
                                                            "ACCELERATE_USE_CPU", "HASTEN_TORCH_DEVICE")}
    activate = ""
    if package is None:  # a device of stock torch: stand in for it before hasten looks
        activate = STAND_IN.format(name=name)
    else:  # a vendor package on the path, which hasten imports only because it is installed
        folder = tmp_path.joinpath(*package.split("."))
        folder.mkdir(parents=True)
        for parent in folder.relative_to(tmp_path).parents:
            if str(parent) != ".":
                (tmp_path / parent / "__init__.py").touch()
        (folder / "__init__.py").write_text(STAND_IN.format(name=name))
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    code = PROBE.format(name=name, activate=textwrap.indent(activate, "") if activate else "")
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(DEVICES))
def test_each_device_is_detected_as_accelerate_does(name, tmp_path):
    _, backend, multi = DEVICES[name]
    seen = _simulate(tmp_path, name)
    assert seen["device"].split(":")[0] == name, seen  # never the CPU
    assert seen["type"] == "NO"
    assert (seen["backend"], seen["multi"]) == (backend, multi), seen
    if name != "mps":  # mps: torch.mps is torch's own; its seed comes from torch.manual_seed
        assert seen["calls"]["seed"] == 7, seen  # set_seed reaches the device's generator
    if name != "hpu":  # Accelerate empties every cache but HPU's (which keeps all its memory for the process)
        assert seen["calls"]["empty_cache"] == 1, seen
    # mixed precision runs where torch has autocast for the device, else one line naming the device
    if seen["autocast"] != "ok":
        assert repr(name) in seen["autocast"] and "\n" not in seen["autocast"], seen


def test_order_is_accelerates_and_cpu_only_when_nothing_is_present():
    present = {"cuda", "npu"}
    assert cluster.detect_device_type(env={}, available=lambda d: d in present) == "npu"  # transfer_to_npu
    assert cluster.detect_device_type(env={}, available=lambda d: d in {"cuda", "xpu"}) == "cuda"
    assert cluster.detect_device_type(env={}, available=lambda d: d in {"hpu", "cuda"}) == "hpu"
    assert cluster.detect_device_type(env={}, available=lambda d: False) == "cpu"
    assert cluster.detect_device_type(cpu=True, env={}, available=lambda d: True) == "cpu"


def test_an_unknown_device_is_refused_in_one_line():
    from hasten.core.errors import ConfigError

    with pytest.raises(ConfigError, match="'weird'"):
        cluster.choose_backend("weird")
    with pytest.raises(ConfigError, match="'weird'"):
        cluster.distributed_type_for("weird", 2, True)
