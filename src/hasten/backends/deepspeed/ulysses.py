"""Accelerate's `sp_size` under DeepSpeed (`sp_backend="deepspeed"`): DeepSpeed's ALST/Ulysses, as Accelerate 1.15
sets it up. `UlyssesSPAttentionHF.register_with_transformers` makes the sequence-parallel groups and registers the
attention with transformers; the `mpu` it returns goes to `deepspeed.initialize`; the training loaders of the same
prepare() call are wrapped in `UlyssesSPDataLoaderAdapter` (each rank of a group gets its slice of the group's
batches, one after the other); the batch arithmetic counts data-parallel ranks with sp folded out.
"""

from __future__ import annotations

import inspect

from ...core.errors import ConfigError

MIN_VERSION = "0.18.2"


def layout(config):
    """The run's layout (the plan's ParallelismConfig, or None) when it asks for DeepSpeed's Ulysses (sp_size > 1),
    else None."""
    return config if config is not None and config.sp_enabled else None


def data_parallel_processes(num_processes: int, config) -> int:
    """The processes that read different batches: all of them, over sp_size under Ulysses (`config`: the layout)."""
    config = layout(config)
    return num_processes // config.sp_size if config is not None else num_processes


def register(config, model, micro_batch_size):
    """Accelerate's checks (its words), then DeepSpeed's registration; returns the `mpu` for deepspeed.initialize.
    `config`: the run's layout, with sp_size > 1."""
    if config.sp_backend != "deepspeed":
        raise ConfigError(f"In order to use the configured sp_size={config.sp_size} with DeepSpeed, you need to "
                          f"configure sp_backend='deepspeed', yet you configured it to be "
                          f"sp_backend={config.sp_backend!r}.")
    from importlib.metadata import version

    from packaging.version import Version

    if Version(version("deepspeed")) < Version(MIN_VERSION):
        raise ImportError(f"Deepspeed ALST/Ulysses requires deepspeed>={MIN_VERSION}. Please update DeepSpeed via "
                          "`pip install deepspeed -U`.")
    if not hasattr(model, "config"):
        raise ValueError("UlyssesSPAttentionHF currently works with HF Transformers and expects the model object to "
                         "have a config attribute but this model doesn't have one.")
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    from ...distributed.sequence_parallel import (
        _refuse_recurrent_layers_under_sequence_parallelism,
    )

    _refuse_recurrent_layers_under_sequence_parallelism(model)
    handler = config.sp_handler
    extra = {}
    if "disable_in_eval" in inspect.signature(UlyssesSPAttentionHF.register_with_transformers).parameters:
        extra["disable_in_eval"] = True
    return UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=model, sequence_parallel_size=config.sp_size, seq_length=handler.sp_seq_length,
        seq_length_is_variable=handler.sp_seq_length_is_variable,
        core_attn_implementation=handler.sp_attn_implementation, micro_batch_size=micro_batch_size, **extra)


def adapt_loader(loader, device, mpu=None):
    """`UlyssesSPDataLoaderAdapter` around a prepared loader, on the groups `mpu` made (None: DeepSpeed's current
    ones, for a loader prepared apart from the model)."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import (
        UlyssesSPDataLoaderAdapter,
    )

    if mpu is None:
        from deepspeed.utils import groups

        group, size, rank = (groups._get_sequence_parallel_group(), groups._get_sequence_parallel_world_size(),
                             groups._get_sequence_parallel_rank())
    else:
        group, size, rank = (mpu.get_sequence_parallel_group(), mpu.get_sequence_parallel_world_size(),
                             mpu.get_sequence_parallel_rank())
    import torch.distributed as dist

    if size > 1 and dist.get_backend(group) == "gloo":
        loader = EvenLengths(loader, group, size, device)
    return UlyssesSPDataLoaderAdapter(loader, sp_rank=rank, sp_group=group, sp_world_size=size, device=device)


def dl_adapter(config, dl, model):
    """`Accelerator.deepspeed_ulysses_dl_adapter`: `adapt_loader` on DeepSpeed's current groups for a loader prepared
    apart from the model; the loader itself when the layout `config` has no sequence parallelism."""
    if config is None or config.sp_size == 1:
        return dl
    if config.native_sp_enabled:
        raise ConfigError("deepspeed_ulysses_dl_adapter is DeepSpeed's (sp_backend='deepspeed'); with "
                          "sp_backend='hasten' prepared loaders are cut already; fix: use the prepared loader")
    return adapt_loader(dl, model.device)


class EvenLengths:
    """A loader whose batches the ranks of an sp group take at the same time, each padded on the right to the
    longest of them (rounded up to a multiple of the group's size) when their lengths differ.

    DeepSpeed's adapter all-gathers every rank's batch to hand each rank its slice of all of them; NCCL gathers
    tensors of different lengths, gloo refuses them ("allgather" of uneven tensors), and Accelerate's own ALST
    example (sp-alst.py: 16 and 12 tokens on two ranks) crashed there on CPU processes. Padding on the right changes
    no result: labels are -100 there, position ids count on, and causal attention never lets a real token see a
    pad. Only under gloo: on NCCL nothing is padded (no tokens computed for nothing)."""

    def __init__(self, loader, group, size: int, device):
        self.loader, self.group, self.size, self.device = loader, group, size, device

    def __len__(self):
        return len(self.loader)

    def __getattr__(self, name):  # batch_size, set_epoch, ...: the loader's own
        if name == "loader":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __iter__(self):
        import torch
        import torch.distributed as dist

        from ...data.sequence_shard import pad_sequence_batch

        for batch in self.loader:
            mine = torch.tensor([batch["input_ids"].shape[1]], dtype=torch.int64, device=self.device)
            lengths = [torch.zeros_like(mine) for _ in range(self.size)]
            dist.all_gather(lengths, mine, group=self.group)
            lengths = [int(t.item()) for t in lengths]
            if len(set(lengths)) > 1:
                batch = pad_sequence_batch(batch, -(-max(lengths) // self.size) * self.size)
            yield batch


__all__ = ["EvenLengths", "adapt_loader", "dl_adapter", "data_parallel_processes", "layout", "register", "true_gradient_loss"]


def true_gradient_loss(loss, model):
    """The loss to back-propagate under DeepSpeed's Ulysses for the gradient of the whole sequence, at every ZeRO stage.

    `loss`: the sp group's loss, the same value on every sp rank (Accelerate's recipe: each rank's loss all-gathered
    over the group and averaged by tokens); `model`: the prepared model (DeepSpeed's engine). Every sp rank then
    back-propagates the whole loss; ZeRO-3 averages the sp ranks' gradients, which gives the true one, but ZeRO-0/1/2
    add them up, which gives `sp_size` times it (hidden by clipping and Adam, not by plain SGD). So this returns
    `loss / sp_size` below stage 3 and `loss` at stage 3 (measured against one process on whole sequences:
    tests/distributed/test_sequence_parallel.py). Without sequence parallelism: `loss`."""
    import torch.distributed as dist

    if not hasattr(model, "zero_optimization_stage"):
        raise ConfigError(f"true_gradient_loss needs the model prepare() returned (DeepSpeed's engine), got "
                          f"{type(model).__name__}; fix: pass the prepared model")
    from deepspeed.utils import groups

    try:
        size = dist.get_world_size(groups._get_sequence_parallel_group())
    except KeyError:  # no sequence parallelism
        return loss
    return loss if size == 1 or model.zero_optimization_stage() == 3 else loss / size
