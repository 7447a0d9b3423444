"""XLA (TPU, and torch_xla's CPU device): every replica holds the whole model; gradients are averaged by one XLA
all-reduce right before the optimizer steps (Accelerate's `xm.optimizer_step` path), and checkpoints go through
CPU copies so that safetensors can write and read them.

Replicas are threads of one process (`xmp.spawn` on TPU v2/v3 and on the CPU device) or processes; nothing here
uses torch.distributed. The step is cut (`mark_step`) by the prepared loader at every batch, as in Accelerate,
and before anything is read back to the host.
"""

from __future__ import annotations

import os

import torch

from ...checkpoint.storage import fast_io, paths
from ...core.constants import MODEL_NAME, OPTIMIZER_NAME, SAFE_MODEL_NAME
from ...core.errors import CheckpointError
from ...distributed import xla
from ...optimizer import AcceleratedOptimizer
from ...checkpoint.files import match_wrapper_prefixes, numbered
from ..base import Backend, refuse_load_kwargs


def _gradients(optimizer) -> list:
    return [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


def reduce_gradients(optimizer) -> None:
    """Average this replica's gradients with the other replicas', once per optimizer step."""
    state = optimizer.gradient_state
    if state.is_xla_gradients_synced:
        return
    if xla.replicated():
        gradients = _gradients(optimizer.optimizer)
        if gradients:
            xla.all_reduce_(gradients, xla.modules()[1].REDUCE_SUM, scale=1.0 / xla.world_size())
    state.is_xla_gradients_synced = True


class XLAOptimizer(AcceleratedOptimizer):
    """Steps as `AcceleratedOptimizer`, after the replicas' gradients are averaged (unless clipping did it)."""

    def step(self, closure=None):
        if self.gradient_state.sync_gradients:
            reduce_gradients(self)
        try:
            return super().step(closure)
        finally:
            self.gradient_state.is_xla_gradients_synced = False


def _fill_tied(model, loaded: dict) -> dict:
    """Give every name of a tied weight the tensor saved under one of its names (safetensors keeps one). XLA
    tensors have no storage pointer to compare: tied names share one Parameter object."""
    names_of = {}
    for name, value in model.state_dict(keep_vars=True).items():
        names_of.setdefault(id(value), []).append(name)
    for names in names_of.values():
        saved = next((loaded[name] for name in names if name in loaded), None)
        if saved is not None:
            for name in names:
                loaded.setdefault(name, saved)
    return loaded


class _OnHost:
    """A model as `save_state` reads it here: its state dict copied to the CPU."""

    def __init__(self, model):
        self.model = model

    def state_dict(self):
        return xla.to_cpu(self.model.state_dict())


class XLABackend(Backend):
    name = "xla"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._optimizers = []
        self._prepared_optimizers = []
        self._bf16_on_tpu()

    def _bf16_on_tpu(self) -> None:
        """bf16 on a TPU is torch_xla's XLA_USE_BF16, or XLA_DOWNCAST_BF16 with downcast_bf16 (as Accelerate)."""
        from ...core.availability import is_torch_xla_available
        from ...core.env import env_flag

        if self.plan.precision.setting != "bf16" or not is_torch_xla_available(check_is_tpu=True):
            return
        downcast = env_flag("DOWNCAST_BF16")
        os.environ["XLA_USE_BF16"], os.environ["XLA_DOWNCAST_BF16"] = ("0", "1") if downcast else ("1", "0")
        self.state.downcast_bfloat = downcast

    def prepare_together(self, models, optimizers, schedulers=(), data_loaders=(), split_batches=False,
                         accumulation_steps: int = 1) -> None:
        # Moving a model to the XLA device makes new parameters: the optimizers built on the old ones follow them.
        self._optimizers.extend(optimizers)

    def prepare_model(self, model, device_placement, evaluation_mode):
        before = list(model.parameters())
        model = super().prepare_model(model, device_placement, evaluation_mode)
        moved = {id(old): new for old, new in zip(before, model.parameters()) if old is not new}
        if moved:
            for optimizer in self._optimizers:
                for group in optimizer.param_groups:
                    group["params"] = [moved.get(id(p), p) for p in group["params"]]
        return model

    def prepare_optimizer(self, optimizer, device_placement: bool, scaler):
        prepared = XLAOptimizer(optimizer, device_placement=device_placement, scaler=scaler)
        self._prepared_optimizers.append(prepared)
        return prepared

    def clip_grad_norm_(self, parameters, max_norm, norm_type=2.0):
        # The norm is the replicas' average gradient's: reduce first (the optimizer then does not reduce again).
        parameters = list(parameters)
        for optimizer in self._prepared_optimizers:
            reduce_gradients(optimizer)
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    # -- checkpoints: through CPU copies (safetensors neither writes nor reads XLA tensors) -------------------------
    def save_model_and_optimizer(self, folder, models, optimizers, *, writer=True, rank=0, safe_serialization=True,
                                 before_write=None, **save_model_func_kwargs):
        from ...checkpoint.storage import durable

        files = self._model_and_optimizer_files([_OnHost(model) for model in models], optimizers, writer,
                                                safe_serialization, before_write, stage=lambda obj, key="": xla.to_cpu(obj))
        for name, write in files:
            durable.write_file(os.path.join(folder, name), write, rank, sync=False)
        return [name for name, _ in files]

    def load_model_and_optimizer(self, folder, models, optimizers, *, map_location="cpu", load_kwargs=None,
                                 strict=True, **load_model_func_kwargs):
        refuse_load_kwargs(self, load_model_func_kwargs, accepted=("assign",))
        for i, model in enumerate(models):
            safe_path = os.path.join(folder, numbered(SAFE_MODEL_NAME, i, ".safetensors"))
            bin_path = os.path.join(folder, numbered(MODEL_NAME, i, ".bin"))
            if paths.is_file(safe_path):
                # Read into host memory, then copy into the model's XLA tensors.
                state_dict = _fill_tied(model, fast_io.load_tensors(safe_path, "cpu"))
            elif paths.is_file(bin_path):
                state_dict = fast_io.load_object(bin_path, load_kwargs, "cpu")
            else:
                raise CheckpointError(f"checkpoint file {safe_path} is missing (nor is there {os.path.basename(bin_path)})")
            try:
                model.load_state_dict(match_wrapper_prefixes(model, state_dict), strict=strict, **load_model_func_kwargs)
            except RuntimeError as error:
                raise CheckpointError(f"cannot load {os.path.basename(safe_path)} into model {i}: {error}") from None
        for i, optimizer in enumerate(optimizers):
            path = os.path.join(folder, numbered(OPTIMIZER_NAME, i, ".bin"))
            optimizer.load_state_dict(fast_io.load_object(path, load_kwargs, "cpu"))
        xla.mark_step()

    def full_state_dict(self, model, unwrap=True):
        return xla.to_cpu(super().full_state_dict(model, unwrap=unwrap))
