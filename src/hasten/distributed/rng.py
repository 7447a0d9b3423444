"""Seeding and random-state synchronisation for Python, NumPy, torch and every device."""

from __future__ import annotations

import random

import numpy as np
import torch

from ..core.enums import DistributedType, RNGType
from ..core.errors import ConfigError
from ..state import PartialState
from . import xla

_DEVICE_RNG_TYPES = ("cuda", "xpu", "npu", "mlu", "musa", "sdaa", "hpu")


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed `random`, NumPy, torch and every accelerator; `device_specific` adds the process index."""
    if device_specific:
        seed += PartialState().process_index
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA/XPU device that is initialised
    for name in (*_DEVICE_RNG_TYPES[1:], "neuron"):
        module = getattr(torch, name, None)
        if module is not None and hasattr(module, "manual_seed_all") and getattr(module, "is_available", lambda: False)():
            module.manual_seed_all(seed)
    if xla.ACTIVE:  # the XLA device's own generator (Accelerate seeds it whenever torch_xla is installed)
        xla.modules()[1].set_rng_state(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def _rng_type(value) -> RNGType:
    try:
        return RNGType(value)
    except ValueError:
        raise ConfigError(f"unknown RNG type {value!r}; choose from {RNGType.list()}") from None


def synchronize_rng_state(rng_type=None, generator: torch.Generator | None = None) -> None:
    """Make this process's `rng_type` state equal to rank 0's."""
    rng_type = _rng_type(rng_type) if rng_type is not None else RNGType.TORCH
    state = PartialState()
    if not state.use_distributed:
        return
    if rng_type == RNGType.TORCH:
        rng_state = torch.get_rng_state()
    elif rng_type == RNGType.GENERATOR:
        if generator is None:
            raise ValueError("Need a generator to synchronize its seed.")
        rng_state = generator.get_state()
    elif rng_type.value in _DEVICE_RNG_TYPES:
        module = getattr(torch, rng_type.value)
        if not module.is_available():
            return
        rng_state = module.get_rng_state()
    elif rng_type == RNGType.XLA:
        if not xla.ACTIVE:
            raise ConfigError("rng_types contains 'xla', but this run is not on the XLA device")
        seed = xla.modules()[1].get_rng_state()  # an unsigned 64-bit seed: carried as its signed twin
        rng_state = torch.tensor([seed - 2**64 if seed >= 2**63 else seed], dtype=torch.int64)
    else:
        return
    if state.distributed_type == DistributedType.XLA:
        buffer = xla.broadcast_(rng_state.to(state.device), 0).cpu()
        if rng_type == RNGType.XLA:
            xla.modules()[1].set_rng_state(int(buffer.item()) % 2**64)
            return
    else:
        buffer = _broadcast_from_first(rng_state, state)
    if rng_type == RNGType.TORCH:
        torch.set_rng_state(buffer)
    elif rng_type == RNGType.GENERATOR:
        generator.set_state(buffer)
    else:
        getattr(torch, rng_type.value).set_rng_state(buffer)


def _broadcast_from_first(rng_state: torch.Tensor, state) -> torch.Tensor:
    import torch.distributed as dist

    on_device = state.backend not in (None, "gloo", "mpi")
    buffer = rng_state.to(state.device) if on_device else rng_state.clone()
    dist.broadcast(buffer, src=0)
    return buffer.cpu()


def synchronize_rng_states(rng_types, generator: torch.Generator | None = None) -> None:
    for rng_type in rng_types:
        synchronize_rng_state(_rng_type(rng_type), generator=generator)


def _device_rng_modules():
    """(name, torch.<name>) for every accelerator kind present and available in this process."""
    for name in _DEVICE_RNG_TYPES:
        module = getattr(torch, name, None)
        if module is not None and getattr(module, "is_available", lambda: False)() and hasattr(module, "get_rng_state_all"):
            yield name, module


def capture_rng_states() -> dict:
    """Every RNG state of this process, under the keys of Accelerate's `random_states_<i>.pkl`, in types that
    `torch.load(weights_only=True)` accepts (so loading it runs no pickled code)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    states = {
        "random_state": random.getstate(),
        "numpy_random_seed": (kind, keys.tolist(), int(pos), int(has_gauss), float(cached)),
        "torch_manual_seed": torch.get_rng_state(),
    }
    for name, module in _device_rng_modules():
        states[f"torch_{name}_manual_seed"] = module.get_rng_state_all()
    if xla.ACTIVE:  # Accelerate's key for the XLA generator's seed
        states["xm_seed"] = int(xla.modules()[1].get_rng_state())  # unsigned 64-bit: no int64 tensor holds it
    return states


def restore_rng_states(states: dict) -> None:
    """Inverse of `capture_rng_states`; also reads the files Accelerate wrote (NumPy arrays, single states)."""
    version, inner, gauss = states["random_state"]
    random.setstate((version, tuple(inner), gauss))
    kind, keys, pos, has_gauss, cached = states["numpy_random_seed"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)))
    torch.set_rng_state(torch.as_tensor(states["torch_manual_seed"], dtype=torch.uint8).cpu())
    for name, module in _device_rng_modules():
        saved = states.get(f"torch_{name}_manual_seed")
        if saved is not None:
            saved = saved if isinstance(saved, (list, tuple)) else [saved]
            module.set_rng_state_all([torch.as_tensor(s, dtype=torch.uint8).cpu() for s in saved])
    if xla.ACTIVE and "xm_seed" in states:
        xla.modules()[1].set_rng_state(int(states["xm_seed"]) % 2**64)
