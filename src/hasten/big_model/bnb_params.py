"""bitsandbytes parameters (`Int8Params`, `Params4bit`) inside the big-model toolkit.

A quantized parameter is not an ordinary tensor: it is quantized when float values first reach a device, and it
carries statistics (`SCB` for int8, a `quant_state` for 4-bit) that a plain `Parameter(...)` rebuild would drop.
`set_module_tensor_to_device` hands such parameters to `place_quantized_parameter` here, and `Accelerator.prepare`
asks `quantized_model_placement` where a quantized model may train. Recognising one costs nothing: a model can
only hold them once bitsandbytes is imported, so nothing here imports it first (and this module stays light).
"""

from __future__ import annotations

import sys

import torch

from ..core.errors import CheckpointError, ConfigError

INSTALL_HINT = 'pip install "hasten[bnb]"'
_QUANTIZED_CLASSES = ("Int8Params", "Params4bit")


def import_bitsandbytes():
    """bitsandbytes, imported on first use (it takes seconds), or an ImportError with the install line."""
    try:
        import bitsandbytes
    except ImportError:
        raise ImportError(f"8-bit and 4-bit quantization needs bitsandbytes: {INSTALL_HINT}") from None
    return bitsandbytes


def is_quantized_parameter(tensor) -> bool:
    """Whether `tensor` is a bitsandbytes int8 or 4-bit parameter."""
    return "bitsandbytes" in sys.modules and type(tensor).__name__ in _QUANTIZED_CLASSES


def is_int8_parameter(tensor) -> bool:
    """Whether `tensor` is the weight of a bitsandbytes 8-bit layer."""
    return "bitsandbytes" in sys.modules and type(tensor).__name__ == "Int8Params"


def quantize_int8(value: torch.Tensor):
    """(int8 rows, per-row fp32 scales `SCB`) of a float weight, computed on the CPU."""
    bnb = import_bitsandbytes()
    int8, scales, _ = bnb.functional.int8_vectorwise_quant(value.detach().to("cpu", torch.float16).contiguous())
    return int8, scales


def _unquantized_like(old, data, bnb):
    """A parameter of `old`'s class and settings holding `data`, not quantized yet."""
    if isinstance(old, bnb.nn.Int8Params):
        return bnb.nn.Int8Params(data, requires_grad=False, has_fp16_weights=old.has_fp16_weights)
    return bnb.nn.Params4bit(data, requires_grad=False, blocksize=old.blocksize,
                             compress_statistics=old.compress_statistics, quant_type=old.quant_type,
                             quant_storage=old.quant_storage, module=old.module)


def place_quantized_parameter(old, value, device, statistics=None, dtype=None):
    """The parameter that replaces the quantized parameter `old` on `device`.

    Without `value`, `old` is moved (its statistics travel with it). A float `value` (cast to `dtype`, else to
    `old`'s dtype while `old` is not quantized yet) is quantized the way `old` was set up (int8, or 4-bit of its quant type, block size and double
    quantization). An int8 `value` is taken as already quantized and needs its `statistics` (the `SCB` row
    scales). On the meta device, the parameter keeps its class and settings (shape and dtype only).
    """
    bnb = import_bitsandbytes()
    device = torch.device(device)
    if value is not None and value.is_floating_point():
        # like any parameter: cast to `dtype`, else to the dtype the (not yet quantized) parameter has
        target = dtype if dtype is not None else old.dtype if old.is_floating_point() else None
        value = value if target is None else value.to(target)
    if device.type == "meta":
        source = value if value is not None else old
        cast = dtype if dtype is not None and source.is_floating_point() else source.dtype
        return _unquantized_like(old, torch.empty(source.shape, dtype=cast, device="meta"), bnb)
    if value is None:
        return old if old.device == device else old.to(device)
    if isinstance(old, bnb.nn.Int8Params):
        if value.dtype == torch.int8:
            if statistics is None:
                raise CheckpointError("an int8 weight reached its Linear8bitLt without its SCB statistics; keep "
                                      "the '<layer>.SCB' tensors next to the int8 weights")
            new = bnb.nn.Int8Params(value.to(device), requires_grad=False, has_fp16_weights=old.has_fp16_weights)
            new.CB = new.data
            new.SCB = statistics.to(device)
            return new
        # bitsandbytes quantizes an Int8Params when it moves off the CPU (or stays there) for the first time.
        return _unquantized_like(old, value.to("cpu", torch.float16), bnb).to(device)
    if not value.is_floating_point():
        raise CheckpointError(f"a {value.dtype} weight reached a 4-bit layer: load_and_quantize_model quantizes "
                              "float checkpoints; pre-quantized 4-bit checkpoints are not supported")
    return _unquantized_like(old, value.to("cpu"), bnb).to(device)


# -- training a quantized model (Accelerator.prepare) -----------------------------------------------------------
def _as_device(device) -> torch.device:
    if isinstance(device, int):
        return torch.device("cuda", device)
    return torch.device(device)


def quantized_model_placement(model, device: torch.device, distributed: bool, device_placement: bool,
                              bnb_runs_on_cpu=lambda: True) -> bool:
    """Whether `prepare()` should move `model` to `device`: False for a bitsandbytes model dispatched with a
    device map (its weights are where they will run). Refuses a quantized model that cannot train there: weights
    offloaded to disk (or to the CPU under a GPU run, or under a CPU run when `bnb_runs_on_cpu()` says
    bitsandbytes cannot train on the CPU here), several devices in a distributed run, another device."""
    if not (getattr(model, "is_loaded_in_8bit", False) or getattr(model, "is_loaded_in_4bit", False)):
        return device_placement
    device_map = getattr(model, "hf_device_map", None)
    if not device_map:
        return device_placement
    bits = "8-bit" if getattr(model, "is_loaded_in_8bit", False) else "4-bit"
    placed = {str(d) for d in device_map.values() if d in ("cpu", "disk")}
    devices = {_as_device(d) for d in device_map.values() if d not in ("cpu", "disk")}
    # On a CPU run "cpu" is where the model runs (when bitsandbytes can compute there); otherwise it is
    # offloading, like "disk".
    offloaded = sorted(p for p in placed if p == "disk" or device.type != "cpu" or not bnb_runs_on_cpu())
    if offloaded:
        cpu_note = ""
        if device.type == "cpu" and not bnb_runs_on_cpu():
            cpu_note = " (bitsandbytes cannot train on the CPU here: no multi-backend build, or the machine has XPUs)"
        # Accelerate's words first (code matches "CPU or disk offload")
        raise ConfigError(f"You can't train a model that has been loaded in 8-bit or 4-bit precision with CPU or disk "
                          f"offload: prepare() got a {bits} model with modules offloaded to {'/'.join(offloaded)}, "
                          f"which cannot train{cpu_note}; load it with device_map={{'': {_map_value(device)!r}}}")
    if "cpu" in placed:
        devices.add(torch.device("cpu"))
    if len(devices) > 1 and distributed:
        raise ConfigError(f"prepare() got a {bits} model spread over {sorted(map(str, devices))}, which cannot train "
                          "in a distributed run; load it on each process's device (device_map={'': "
                          "accelerator.process_index}) or launch one process")
    if len(devices) == 1:
        loaded_on = next(iter(devices))
        same_index = loaded_on.index == device.index or (device.index is None and loaded_on.index in (None, 0))
        if loaded_on.type != device.type or not same_index:
            raise ConfigError(f"prepare() got a {bits} model loaded on {loaded_on} but this process trains on "
                              f"{device}; load it with device_map={{'': {_map_value(device)!r}}}")
    return False


def _map_value(device: torch.device):
    return device.index if device.type == "cuda" and device.index is not None else str(device)
