"""Mixed precision: the run's precision policy (autocast dtype, loss scaling) and fp32 outputs from prepared models."""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass, field, replace

import torch

from ..core.dtypes import PRECISION_DTYPES
from ..core.errors import ConfigError
from ..core.nested import convert_outputs_to_fp32

_AUTOCAST_MODES = ("fp16", "bf16", "fp8")  # fp8 runs autocast to bf16 around its fp8 matmuls, as Accelerate


@dataclass(frozen=True)
class PrecisionPolicy:
    """The precision of one run, built once from the mixed_precision setting and handed to the backend.

    `autocast_dtype` is what forward passes compute in (None: fp32); `uses_grad_scaler` says whether losses are
    scaled (fp16), and the backend makes the scaler (`Backend.make_grad_scaler`), since sharded backends need
    their own kind. Unlike Accelerate 1.15 (where fp16 on CPU silently trains in fp32), fp16 on CPU autocasts
    and scales for real, since torch supports both there; a device that cannot autocast to the dtype is an error.

    `fp8` (an `hasten.training.fp8.Fp8Recipe`, fp8 runs only) converts the models' layers at `prepare`.
    """

    mode: str = "no"
    device_type: str = "cpu"
    autocast_kwargs: dict = field(default_factory=dict)
    scaler_kwargs: dict = field(default_factory=dict)
    fp8: object = field(default=None, compare=False)

    @classmethod
    def from_setting(cls, mode: str, device: torch.device, autocast_handler=None, scaler_handler=None,
                     fp8_handler=None, fp8_engine: str | None = None):
        """Validate `mode` for `device` once; the kwargs handlers' values are read here and frozen.

        fp8 is checked here, when the Accelerator is built: a machine that cannot run it is told in one line
        before any work is done. `fp8_engine` is the run plan's choice of library."""
        fp8 = None
        if mode == "fp8" or fp8_handler is not None or any(k.startswith(("HASTEN_FP8_", "ACCELERATE_FP8_"))
                                                           for k in os.environ):
            from .fp8 import recipe_for

            fp8 = recipe_for(mode, device, fp8_handler, fp8_engine)
        device_type = torch.device(device).type
        if mode in _AUTOCAST_MODES and not torch.amp.is_autocast_available(device_type):
            raise ConfigError(
                f"mixed_precision={mode!r} needs autocast on {device_type!r}, which this torch build lacks; "
                "use mixed_precision='no' or another device"
            )
        if mode == "bf16" and device_type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ConfigError("mixed_precision='bf16' is not supported by this GPU; use 'fp16' (or 'no')")
        return cls(
            mode=mode, device_type=device_type,
            autocast_kwargs=autocast_handler.to_kwargs() if autocast_handler is not None else {},
            scaler_kwargs=scaler_handler.to_kwargs() if scaler_handler is not None else {},
            fp8=fp8,
        )

    @classmethod
    def from_plan(cls, plan, device: torch.device):
        """The policy of a run plan's precision (`RunPlan.precision`: what it trains in, fp8's engine), without the
        script's kwargs handlers: for a backend built without the Accelerator's policy."""
        return cls.from_setting(plan.precision.trains_in, device, fp8_engine=plan.precision.fp8_engine)

    def applied_by_engine(self):
        """This policy for a backend whose engine casts the model and scales losses itself (DeepSpeed's config):
        no autocast and no loss scaler here; the fp8 recipe (layers converted at `prepare`) stays the run's."""
        return replace(self, mode="no", autocast_kwargs={}, scaler_kwargs={})

    @property
    def autocast_dtype(self):
        return PRECISION_DTYPES[self.mode] if self.mode in _AUTOCAST_MODES else None

    # Accelerate's names for the same facts.
    dtype = autocast_dtype

    @property
    def native_amp(self) -> bool:
        return self.mode in _AUTOCAST_MODES

    @property
    def uses_grad_scaler(self) -> bool:
        return self.mode == "fp16"

    @property
    def fp8_backend(self):
        """Accelerate's `FP8BackendType` of the run (NO unless fp8)."""
        from ..core.enums import FP8BackendType

        return FP8BackendType(self.fp8.backend) if self.fp8 is not None else FP8BackendType.NO

    def convert_models(self, models, optimizers=(), fsdp2: bool = False) -> None:
        """fp8: swap the models' layers for fp8 ones (before any sharding) and re-point the optimizers."""
        if self.fp8 is not None:
            self.fp8.convert(models, optimizers, fsdp2=fsdp2)

    def repoint_optimizer(self, optimizer) -> None:
        """fp8: an optimizer built on a model before its conversion updates the converted parameters."""
        if self.fp8 is not None:
            self.fp8.repoint(optimizer)

    def wrap_prepared(self, model):
        """fp8 with TransformerEngine: the prepared model's forward runs under `fp8_autocast`."""
        return self.fp8.wrap_prepared(model) if self.fp8 is not None else model

    def autocast(self, autocast_handler=None):
        """A context manager running the block in the policy's precision (a no-op for 'no')."""
        if not self.native_amp:
            return contextlib.nullcontext()
        kwargs = self.autocast_kwargs
        if autocast_handler is not None:
            kwargs = {**kwargs, **autocast_handler.to_kwargs()}
        return torch.autocast(device_type=self.device_type, dtype=self.autocast_dtype, **kwargs)

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

    def __init__(self, forward, policy: PrecisionPolicy):
        self.__wrapped__ = forward
        self.policy = policy
        functools.update_wrapper(self, forward)
        # Read once: this runs on every forward.
        self._autocast_args = (policy.device_type, policy.autocast_dtype, dict(policy.autocast_kwargs))

    def __call__(self, *args, **kwargs):
        device_type, dtype, autocast_kwargs = self._autocast_args
        with torch.autocast(device_type, dtype=dtype, **autocast_kwargs):
            return self.__wrapped__(*args, **kwargs)


def remove_precision_wrapper(model: torch.nn.Module) -> torch.nn.Module:
    """Undo `PrecisionPolicy.wrap_forward` on `model` (restoring its original bound forward)."""
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
    from ..core.availability import is_torch_version
    from ..core.enums import DistributedType
    from ..state import PartialState

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
    from ..state import AcceleratorState

    state = AcceleratorState()
    kwargs = autocast_kwargs.to_kwargs() if autocast_kwargs is not None else {}
    dtype = PRECISION_DTYPES.get(state.mixed_precision)
    if dtype is not None:
        kwargs["dtype"] = dtype
    return torch.autocast(device_type=state.device.type, **kwargs)
