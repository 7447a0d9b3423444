"""Mixed precision: the autocast context, the fp16 gradient scaler, and fp32 outputs from prepared models."""

from __future__ import annotations

import contextlib
import functools

import torch

from .errors import ConfigError, NotSupportedYetError
from .operations import convert_outputs_to_fp32

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class MixedPrecision:
    """The precision policy of one run: which dtype autocast uses and whether gradients need scaling.

    Unlike Accelerate 1.15 (where fp16 on CPU silently trains in fp32), fp16 on CPU autocasts and scales
    for real, since torch supports both there; a device that cannot autocast to the dtype is an error.
    """

    def __init__(self, mode: str, device: torch.device, autocast_kwargs=None, scaler_kwargs=None,
                 scaler_factory=None):
        self.mode = mode
        self.device_type = device.type
        self.autocast_kwargs = autocast_kwargs.to_kwargs() if autocast_kwargs is not None else {}
        if mode == "fp8":
            raise NotSupportedYetError(
                "mixed_precision='fp8' is not supported by hasten yet; use 'bf16' (or 'fp16' with a scaler)"
            )
        self.dtype = _DTYPES.get(mode)
        self.native_amp = self.dtype is not None
        if self.native_amp and not torch.amp.is_autocast_available(self.device_type):
            raise ConfigError(
                f"mixed_precision={mode!r} needs autocast on {self.device_type!r}, which this torch build lacks; "
                "use mixed_precision='no' or another device"
            )
        if mode == "bf16" and self.device_type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ConfigError("mixed_precision='bf16' is not supported by this GPU; use 'fp16' (or 'no')")
        self.scaler = None
        if mode == "fp16":
            kwargs = scaler_kwargs.to_kwargs() if scaler_kwargs is not None else {}
            factory = scaler_factory or functools.partial(torch.amp.GradScaler, self.device_type)
            self.scaler = factory(**kwargs)

    def autocast(self, autocast_handler=None):
        """A context manager running the block in the policy's precision (a no-op for 'no')."""
        if not self.native_amp:
            return contextlib.nullcontext()
        kwargs = self.autocast_kwargs
        if autocast_handler is not None:
            kwargs = {**kwargs, **autocast_handler.to_kwargs()}
        return torch.autocast(device_type=self.device_type, dtype=self.dtype, **kwargs)

    def wrap_forward(self, model: torch.nn.Module) -> None:
        """Run `model.forward` under autocast and hand its fp16/bf16 outputs back in fp32.

        The original bound forward stays reachable (`model._original_forward`, `__wrapped__`) so that
        `unwrap_model(keep_fp32_wrapper=False)` can undo this.
        """
        if not self.native_amp or getattr(model, "_hasten_precision_wrapped", False):
            return
        original = model.forward
        model._original_forward = original
        autocast_forward = _AutocastForward(original, self)
        model.forward = convert_outputs_to_fp32(autocast_forward)
        model._hasten_precision_wrapped = True


class _AutocastForward:
    """`forward` run under the policy's autocast; a class (not a closure) so the chain can be undone."""

    def __init__(self, forward, policy: MixedPrecision):
        self.__wrapped__ = forward
        self.policy = policy
        functools.update_wrapper(self, forward)

    def __call__(self, *args, **kwargs):
        with self.policy.autocast():
            return self.__wrapped__(*args, **kwargs)


def remove_precision_wrapper(model: torch.nn.Module) -> torch.nn.Module:
    """Undo `MixedPrecision.wrap_forward` on `model` (restoring its original bound forward)."""
    original = getattr(model, "_original_forward", None)
    if original is not None:
        if "forward" in model.__dict__:
            del model.__dict__["forward"]
        if model.forward != original:
            model.forward = original
        del model._original_forward
        model._hasten_precision_wrapped = False
    return model


# -- Accelerate's standalone helpers (`accelerate.utils.get_grad_scaler`, ...) ------------------------------------
def get_grad_scaler(distributed_type=None, **kwargs):
    """A gradient scaler for this process's device (kwargs go to its constructor).

    FSDP gets torch's `ShardedGradScaler`. Elsewhere the scaler is made for the device hasten runs on, so a
    CPU run gets a working CPU scaler (Accelerate 1.15 hands it a CUDA scaler that disables itself).
    """
    from .availability import is_torch_version
    from .enums import DistributedType
    from .state import PartialState

    device_type = PartialState().device.type
    if distributed_type == DistributedType.FSDP:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(**{"device": device_type, **kwargs})
    if device_type == "mps" and not is_torch_version(">=", "2.8.0"):
        raise ConfigError("a gradient scaler on MPS needs torch >= 2.8; use mixed_precision='bf16' or upgrade torch")
    return torch.amp.GradScaler(device_type, **kwargs)


def get_mixed_precision_context_manager(native_amp: bool = False, autocast_kwargs=None):
    """The autocast context of the run's mixed precision (`AcceleratorState().mixed_precision`): fp16 or bf16
    (fp8 runs compute the rest in bf16); a do-nothing context when `native_amp` is False."""
    if not native_amp:
        return contextlib.nullcontext()
    from .state import AcceleratorState

    state = AcceleratorState()
    kwargs = autocast_kwargs.to_kwargs() if autocast_kwargs is not None else {}
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}.get(state.mixed_precision)
    if dtype is not None:
        kwargs["dtype"] = dtype
    return torch.autocast(device_type=state.device.type, **kwargs)
