"""Accelerate's `utils.megatron_lm` path, served without the Megatron-LM library.

The helpers that make sense on hasten's own mesh are built (`avg_losses_across_data_parallel_group`,
`gather_across_data_parallel_groups`: over the data-parallel ranks of the layout). The rest drives the
Megatron-LM library itself (its engine, train steps, data loader, initialisation, optimizer and scheduler
wrappers): each keeps Accelerate's signature and raises `MegatronLMOnlyError` in one line naming the native way
when instantiated or called. Settings: `hasten.config.megatron.MegatronLMPlugin`; docs/parallelism.md.
"""

from __future__ import annotations

import torch

from ..config.megatron import _megatron_only

_PREPARE = "pass the model, optimizer, DataLoader and torch LR scheduler to accelerator.prepare()"
_STEP = ("write the step in your loop: loss = model(inputs, labels=labels) (a pipelined model runs its schedule and "
         "backward), then optimizer.step()")


class MegatronLMDummyDataLoader:
    """Megatron-LM's indexed data sets: Megatron-only."""

    def __init__(self, **dataset_kwargs):
        raise _megatron_only("MegatronLMDummyDataLoader", "use a torch DataLoader with accelerator.prepare()")


class MegatronLMOptimizerWrapper:
    """The wrapper of Megatron-LM's optimizer: Megatron-only (accelerator.prepare wraps a torch optimizer)."""

    def __init__(self, optimizer):
        raise _megatron_only("MegatronLMOptimizerWrapper", "pass your torch optimizer to accelerator.prepare()")


class MegatronLMDummyScheduler:
    """A stand-in for the LR schedule Megatron-LM's library builds from the plugin: Megatron-only."""

    def __init__(self, optimizer, total_num_steps=None, warmup_num_steps=0, **kwargs):
        raise _megatron_only("MegatronLMDummyScheduler", "use a torch LR scheduler (e.g. LambdaLR for linear warmup "
                             "and decay) with accelerator.prepare()")


class MegatronLMSchedulerWrapper:
    """The wrapper of Megatron-LM's scheduler: Megatron-only."""

    def __init__(self, scheduler, optimizers):
        raise _megatron_only("MegatronLMSchedulerWrapper", "pass your torch LR scheduler to accelerator.prepare()")


class AbstractTrainStep:
    """The base of Megatron-LM train steps: Megatron-only."""

    def __init__(self, name):
        raise _megatron_only(f"{type(self).__name__}", _STEP)


class BertTrainStep(AbstractTrainStep):
    def __init__(self, accelerator, args):
        super().__init__("BertTrainStep")


class GPTTrainStep(AbstractTrainStep):
    def __init__(self, accelerator, args):
        super().__init__("GPTTrainStep")


class T5TrainStep(AbstractTrainStep):
    def __init__(self, accelerator, args):
        super().__init__("T5TrainStep")


class MegatronEngine(torch.nn.Module):
    """Megatron-LM's model engine: Megatron-only (accelerator.prepare returns hasten's pipelined/split model)."""

    def __init__(self, accelerator, model, optimizer, scheduler):
        raise _megatron_only("MegatronEngine", "accelerator.prepare(model) returns the model split over the "
                             "tensor/pipeline mesh; " + _STEP)


def initialize(accelerator, extra_args_provider=None, args_defaults=None):
    raise _megatron_only("megatron_lm initialize", "Accelerator(megatron_lm_plugin=...) sets up the mesh itself")


def prepare_data_loader(accelerator, dataloader):
    raise _megatron_only("megatron_lm prepare_data_loader", _PREPARE)


def prepare_model_optimizer_scheduler(accelerator):
    raise _megatron_only("megatron_lm prepare_model_optimizer_scheduler", _PREPARE)


def prepare_optimizer(accelerator, model):
    raise _megatron_only("megatron_lm prepare_optimizer", _PREPARE)


def prepare_scheduler(accelerator, optimizer, scheduler):
    raise _megatron_only("megatron_lm prepare_scheduler", _PREPARE)


def finish_mpu_init():
    raise _megatron_only("megatron_lm finish_mpu_init", "Accelerator(megatron_lm_plugin=...) sets up the mesh itself")


def model_provider_func(pre_process=True, post_process=True, add_encoder=True, add_decoder=True):
    raise _megatron_only("megatron_lm model_provider_func", "build your nn.Module and pass it to accelerator.prepare()")


# Accelerate's `accelerate.utils` names for the functions above.
megatron_lm_initialize = initialize
megatron_lm_prepare_data_loader = prepare_data_loader
megatron_lm_prepare_model_optimizer_scheduler = prepare_model_optimizer_scheduler
megatron_lm_prepare_optimizer = prepare_optimizer
megatron_lm_prepare_scheduler = prepare_scheduler


def _data_parallel_group():
    """(group, size) of this process's data-parallel ranks: the layout's `dp` dimensions, every process when the
    run has no mesh, (None, 1) outside a distributed run or when the layout has no data-parallel dimension."""
    import torch.distributed as dist

    from ..state import AcceleratorState

    if not (dist.is_available() and dist.is_initialized()):
        return None, 1
    state = AcceleratorState._shared_state
    config = state.get("parallelism_config")
    if state.get("device_mesh") is None or config is None:
        return dist.group.WORLD, dist.get_world_size()
    if not config.dp_dim_names:
        return None, 1
    group = config.submesh("dp").get_group()
    return group, dist.get_world_size(group)


def avg_losses_across_data_parallel_group(losses):
    """The mean of each loss over the data-parallel ranks, as one 1-D tensor (one entry per loss)."""
    import torch.distributed as dist

    averaged = torch.cat([loss.detach().clone().float().reshape(1) for loss in losses])
    group, size = _data_parallel_group()
    if group is not None and size > 1:
        dist.all_reduce(averaged, group=group)
        averaged /= size
    return averaged


def gather_across_data_parallel_groups(tensor):
    """Every data-parallel rank's tensors (nested lists/tuples/dicts), concatenated along the first dimension;
    a 0-d tensor becomes one entry."""
    import torch.distributed as dist

    from ..core.nested import recursively_apply

    group, size = _data_parallel_group()

    def gather_one(value):
        value = value.clone()[None] if value.ndim == 0 else value.contiguous()
        if group is None or size == 1:
            return value
        parts = [torch.empty_like(value) for _ in range(size)]
        dist.all_gather(parts, value, group=group)
        return torch.cat(parts, dim=0)

    return recursively_apply(gather_one, tensor, error_on_other_type=True)


__all__ = [
    "AbstractTrainStep", "BertTrainStep", "GPTTrainStep", "MegatronEngine", "MegatronLMDummyDataLoader",
    "MegatronLMDummyScheduler", "MegatronLMOptimizerWrapper", "MegatronLMSchedulerWrapper", "T5TrainStep",
    "avg_losses_across_data_parallel_group", "gather_across_data_parallel_groups", "initialize",
    "prepare_data_loader", "prepare_model_optimizer_scheduler", "prepare_optimizer", "prepare_scheduler",
    "finish_mpu_init", "model_provider_func",
]
