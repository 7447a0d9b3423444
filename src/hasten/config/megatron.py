"""`MegatronLMPlugin`: Megatron-LM's settings, run by hasten's own tensor, pipeline and data parallelism.

hasten does not drive the Megatron-LM library. A setting that describes how the work is split or how memory is
saved becomes hasten's native equivalent on the one device mesh (`hasten.plan.megatron_layout`):

    tp_degree                  -> ParallelismConfig(tp_size=...)           (hasten.distributed.tp_plan)
    pp_degree                  -> ParallelismConfig(pp_size=...)           (backends/pipeline.py)
    num_micro_batches          -> TorchPipelineParallelConfig(microbatches=...)
    use_distributed_optimizer  -> the data-parallel ranks shard with FSDP2 (dp_shard) instead of replicating
    recompute_activations      -> every block is activation-checkpointed
    gradient_clipping          -> the global L2 norm is clipped before each optimizer step (Megatron's train step
                                  does the same; 1.0 by default, 0 turns it off)

Everything else belongs to the Megatron-LM library (its model providers, train steps, data sets, LR scheduler,
logging) and is refused in one line naming the native way, whenever it differs from Accelerate's default. The
table is docs/parallelism.md ("Megatron-LM settings").
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..core.errors import ConfigError, MegatronLMOnlyError

_SCHEDULER = "use a torch LR scheduler (torch.optim.lr_scheduler) with accelerator.prepare()"
_PARAM_GROUPS = "give your torch optimizer parameter groups with their own lr/weight_decay"
_MODEL = "hasten trains your own nn.Module: set it in the model"
_LOADER = "use a torch DataLoader with accelerator.prepare()"
_TRAIN_STEP = "write the step in your loop: loss = model(inputs, labels=labels) (a pipelined model runs its schedule)"
_EVAL = "run your own evaluation loop (model.eval(); with torch.no_grad(): ...)"
_TRACKING = "Accelerator(log_with='tensorboard', project_dir=...)"

# Fields only the Megatron-LM library reads: (Accelerate's default, what to do instead). Set to anything else,
# they are refused.
_MEGATRON_ONLY: dict[str, tuple[Any, str]] = {
    "use_custom_fsdp": (False, "use FSDP2: --use_fsdp, or use_distributed_optimizer=True"),
    "overlap_cpu_optimizer_d2h_h2d": (False, "FullyShardedDataParallelPlugin(cpu_offload=True)"),
    "no_load_optim": (False, "load only what you need with accelerator.load_state / load_checkpoint_in_model"),
    "eod_mask_loss": (False, f"{_MODEL} (mask end-of-document tokens with label -100)"),
    "no_save_optim": (False, "save the model only with accelerator.save_model"),
    "optimizer_cpu_offload": (False, "FullyShardedDataParallelPlugin(cpu_offload=True)"),
    "use_precision_aware_optimizer": (False, "Accelerator(mixed_precision='bf16') keeps fp32 optimizer state"),
    "decoder_last_pipeline_num_layers": (None, "TorchPipelineParallelConfig(split_points=[...])"),
    "recompute_granularity": ("full", "recompute_activations=True checkpoints whole blocks"),
    "recompute_method": ("uniform", "recompute_activations=True checkpoints every block"),
    "recompute_num_layers": (1, "recompute_activations=True checkpoints every block"),
    "attention_backend": (True, _MODEL),
    "expert_model_parallel_size": (1, "expert parallelism is not built in hasten: leave it at 1"),
    "context_parallel_size": (1, "ParallelismConfig(cp_size=...) on CUDA, without the Megatron-LM plugin"),
    "attention_dropout": (0.0, _MODEL),
    "hidden_dropout": (0.0, _MODEL),
    "attention_softmax_in_fp32": (True, _MODEL),
    "expert_tensor_parallel_size": (1, "expert parallelism is not built in hasten: leave it at 1"),
    "calculate_per_token_loss": (True, "GradientAccumulationPlugin(normalize_by_tokens=True)"),
    "use_rotary_position_embeddings": (True, _MODEL),
    "pipeline_model_parallel_split_rank": (None, "TorchPipelineParallelConfig(split_points=[...])"),
    "num_layers_per_virtual_pipeline_stage": (
        None, "ParallelismConfig(pp_size=..., pp_handler=TorchPipelineParallelConfig(schedule='Interleaved1F1B', "
              "stages_per_rank=...)) without the Megatron-LM plugin"),
    "is_train_batch_min": (True, "the DataLoader's batch_size is the micro-batch size"),
    "train_iters": (None, _SCHEDULER), "train_samples": (None, _SCHEDULER),
    "weight_decay_incr_style": ("constant", _SCHEDULER), "start_weight_decay": (None, _PARAM_GROUPS),
    "end_weight_decay": (None, _PARAM_GROUPS), "lr_decay_style": ("linear", _SCHEDULER),
    "lr_decay_iters": (None, _SCHEDULER), "lr_decay_samples": (None, _SCHEDULER),
    "lr_warmup_iters": (None, _SCHEDULER), "lr_warmup_samples": (None, _SCHEDULER),
    "lr_warmup_fraction": (None, _SCHEDULER), "min_lr": (0, _SCHEDULER),
    "consumed_samples": (None, "resume with accelerator.save_state/load_state (the loader skips what was read)"),
    "no_wd_decay_cond": (None, _PARAM_GROUPS), "scale_lr_cond": (None, _PARAM_GROUPS), "lr_mult": (1.0, _PARAM_GROUPS),
    "megatron_dataset_flag": (False, _LOADER), "seq_length": (None, f"{_LOADER} (the batches set the length)"),
    "encoder_seq_length": (None, _LOADER), "decoder_seq_length": (None, _LOADER),
    "tensorboard_dir": (None, _TRACKING), "set_all_logging_options": (False, _TRACKING),
    "eval_iters": (100, _EVAL), "eval_interval": (1000, _EVAL),
    "return_logits": (False, "call the prepared model in eval mode: it returns the logits"),
    "custom_train_step_class": (None, _TRAIN_STEP), "custom_train_step_kwargs": (None, _TRAIN_STEP),
    "custom_model_provider_function": (None, "build your nn.Module and pass it to accelerator.prepare()"),
    "custom_prepare_model_function": (None, "build your nn.Module and pass it to accelerator.prepare()"),
    "custom_megatron_datasets_provider_function": (None, _LOADER),
    "custom_get_batch_function": (None, _LOADER),
    "custom_loss_function": (None, "TorchPipelineParallelConfig(loss_fn=...), or compute the loss in your loop"),
    "other_megatron_args": (None, "set the option on your model, optimizer or ParallelismConfig"),
}
# The launcher exports these (MEGATRON_LM_*); the plugin reads them when the field is not passed.
_FROM_ENV = ("use_custom_fsdp", "overlap_cpu_optimizer_d2h_h2d", "no_load_optim", "eod_mask_loss", "no_save_optim",
             "optimizer_cpu_offload", "use_precision_aware_optimizer", "decoder_last_pipeline_num_layers",
             "recompute_granularity", "recompute_method", "recompute_num_layers", "attention_backend",
             "expert_model_parallel_size", "context_parallel_size", "attention_dropout", "hidden_dropout",
             "attention_softmax_in_fp32", "expert_tensor_parallel_size", "calculate_per_token_loss",
             "use_rotary_position_embeddings")
_HONOURED = ("tp_degree", "pp_degree", "num_micro_batches", "sequence_parallelism", "recompute_activations",
             "use_distributed_optimizer", "gradient_clipping")
_HONOURED_DEFAULTS = {"num_micro_batches": 1}  # the table's row is unset (None) so the launcher exports it only when given


def _megatron_only(what: str, fix: str) -> MegatronLMOnlyError:
    return MegatronLMOnlyError(f"{what} exists only inside the Megatron-LM library, which hasten does not drive; "
                               f"fix: {fix}")


@dataclass
class MegatronLMPlugin:
    """Megatron-LM's settings (Accelerate's fields, defaults and MEGATRON_LM_* variables), served by hasten's own
    TP/PP/FSDP: see the module docstring and docs/parallelism.md."""

    tp_degree: int = None
    pp_degree: int = None
    use_custom_fsdp: bool = None
    overlap_cpu_optimizer_d2h_h2d: bool = None
    no_load_optim: bool = None
    eod_mask_loss: bool = None
    no_save_optim: bool = None
    optimizer_cpu_offload: bool = None
    use_precision_aware_optimizer: bool = None
    decoder_last_pipeline_num_layers: int = None
    recompute_granularity: str = None
    recompute_method: str = None
    recompute_num_layers: int = None
    attention_backend: bool = None
    expert_model_parallel_size: int = None
    context_parallel_size: int = None
    attention_dropout: float = None
    hidden_dropout: float = None
    attention_softmax_in_fp32: bool = None
    expert_tensor_parallel_size: int = None
    calculate_per_token_loss: bool = None
    use_rotary_position_embeddings: bool = None
    num_micro_batches: int = None
    gradient_clipping: float = None
    sequence_parallelism: bool = None
    recompute_activations: bool = None
    use_distributed_optimizer: bool = None
    pipeline_model_parallel_split_rank: int = None
    num_layers_per_virtual_pipeline_stage: int = None
    is_train_batch_min: str = True
    train_iters: int = None
    train_samples: int = None
    weight_decay_incr_style: str = "constant"
    start_weight_decay: float = None
    end_weight_decay: float = None
    lr_decay_style: str = "linear"
    lr_decay_iters: int = None
    lr_decay_samples: int = None
    lr_warmup_iters: int = None
    lr_warmup_samples: int = None
    lr_warmup_fraction: float = None
    min_lr: float = 0
    consumed_samples: list[int] = None
    no_wd_decay_cond: Optional[Callable] = None
    scale_lr_cond: Optional[Callable] = None
    lr_mult: float = 1.0
    megatron_dataset_flag: bool = False
    seq_length: int = None
    encoder_seq_length: int = None
    decoder_seq_length: int = None
    tensorboard_dir: str = None
    set_all_logging_options: bool = False
    eval_iters: int = 100
    eval_interval: int = 1000
    return_logits: bool = False
    custom_train_step_class: Optional[Any] = None
    custom_train_step_kwargs: Optional[dict[str, Any]] = None
    custom_model_provider_function: Optional[Callable] = None
    custom_prepare_model_function: Optional[Callable] = None
    custom_megatron_datasets_provider_function: Optional[Callable] = None
    custom_get_batch_function: Optional[Callable] = None
    custom_loss_function: Optional[Callable] = None
    other_megatron_args: Optional[dict[str, Any]] = None
    megatron_lm_default_args: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self):
        from .resolve import runtime_value

        for name in _HONOURED:  # code > MEGATRON_LM_<NAME> > default, through the settings table
            value = runtime_value(f"megatron_lm_{name}", getattr(self, name)).value
            setattr(self, name, _HONOURED_DEFAULTS.get(name) if value is None else value)
        for name in _FROM_ENV:
            if getattr(self, name) is None:
                setattr(self, name, _env_value(name))
        for name, (default, fix) in _MEGATRON_ONLY.items():
            value = getattr(self, name)
            if value is not None and value != default:
                raise _megatron_only(f"MegatronLMPlugin({name}={value!r})", fix)
            if value is None and default is not None:
                setattr(self, name, default)
        if self.sequence_parallelism:
            from . import settings

            settings.get("megatron_lm_sequence_parallelism").refuse("MegatronLMPlugin(sequence_parallelism=True)", True)
        for name in ("tp_degree", "pp_degree", "num_micro_batches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"MegatronLMPlugin({name}={value!r}) must be a whole number of 1 or more")
        if self.pp_degree == 1 and self.num_micro_batches > 1:
            raise ConfigError(f"MegatronLMPlugin(num_micro_batches={self.num_micro_batches}) with pp_degree=1 is "
                              "gradient accumulation; fix: Accelerator(gradient_accumulation_steps="
                              f"{self.num_micro_batches}) and leave num_micro_batches at 1")
        if self.recompute_activations and self.tp_degree == 1 and self.pp_degree == 1:
            raise ConfigError("MegatronLMPlugin(recompute_activations=True) with tp_degree=pp_degree=1 has no "
                              "tensor/pipeline layout to checkpoint; fix: --use_fsdp --fsdp_activation_checkpointing "
                              "true (FullyShardedDataParallelPlugin(activation_checkpointing=True))")
        if not float(self.gradient_clipping) >= 0:
            raise ConfigError(f"MegatronLMPlugin(gradient_clipping={self.gradient_clipping!r}) must be 0 (off) or more")
        self.megatron_lm_default_args = {
            "tensor_model_parallel_size": self.tp_degree, "pipeline_model_parallel_size": self.pp_degree,
            "num_micro_batches": self.num_micro_batches, "clip_grad": self.gradient_clipping,
            "recompute_activations": self.recompute_activations,
            "use_distributed_optimizer": self.use_distributed_optimizer,
            "sequence_parallel": self.sequence_parallelism,
        }

    # -- Megatron-LM's argument builders: only its library reads their output ---------------------------------
    def set_network_size_args(self, model, batch_data=None):
        raise _megatron_only("MegatronLMPlugin.set_network_size_args", "pass your nn.Module to accelerator.prepare()")

    def set_mixed_precision(self, mixed_precision):
        raise _megatron_only("MegatronLMPlugin.set_mixed_precision", "Accelerator(mixed_precision=...)")

    def set_training_args(self, micro_batch_size, dp_degree):
        raise _megatron_only("MegatronLMPlugin.set_training_args", "the DataLoader's batch_size is the micro-batch "
                             "size; num_micro_batches splits it for the pipeline")

    def set_optimizer_type(self, optimizer):
        raise _megatron_only("MegatronLMPlugin.set_optimizer_type", "pass your torch optimizer to accelerator.prepare()")

    def set_scheduler_args(self, scheduler):
        raise _megatron_only("MegatronLMPlugin.set_scheduler_args", _SCHEDULER)

    def set_tensorboard_logging_options(self):
        raise _megatron_only("MegatronLMPlugin.set_tensorboard_logging_options", _TRACKING)


def _env_value(name: str):
    from . import settings

    row = settings.get(f"megatron_lm_{name}")
    for variable in row.env:
        text = os.environ.get(variable)
        if text:
            try:
                return row.convert(text)
            except ValueError as error:
                raise ConfigError(f"environment variable {variable}={text!r} is not valid for {row.name} ({error}); "
                                  f"fix: `unset {variable}`") from None
    return None


def clip_at_step(plugin: MegatronLMPlugin, optimizer, backend) -> None:
    """Clip the global gradient norm to `gradient_clipping` just before each step of `optimizer` (the prepared
    one), as Megatron-LM's train step does: after fp16 unscaling, skipped with the step on overflow."""
    if not plugin.gradient_clipping:
        return
    max_norm = float(plugin.gradient_clipping)
    inner = getattr(optimizer, "optimizer", optimizer)

    def clip(opt, args, kwargs):
        params = [p for group in opt.param_groups for p in group["params"]]
        backend.clip_grad_norm_(params, max_norm)

    inner.register_step_pre_hook(clip)


__all__ = ["MegatronLMPlugin", "add_model_config_to_megatron_parser"]


def add_model_config_to_megatron_parser(model_type: str):
    """Accelerate's decorator that registers a Megatron-LM argument parser for a model type: Megatron-only."""
    raise _megatron_only(f"add_model_config_to_megatron_parser({model_type!r})",
                         "pass your nn.Module to accelerator.prepare(); its config stays in the model")


_CONFIG = "pass your nn.Module to accelerator.prepare(); its config stays in the model"


def parse_bert_config(megatron_lm_plugin, model, batch_data):
    raise _megatron_only("megatron_lm parse_bert_config", _CONFIG)


def parse_gpt2_config(megatron_lm_plugin, model, batch_data):
    raise _megatron_only("megatron_lm parse_gpt2_config", _CONFIG)


def parse_t5_config(megatron_lm_plugin, model, batch_data):
    raise _megatron_only("megatron_lm parse_t5_config", _CONFIG)


def parse_llama_config(megatron_lm_plugin, model, batch_data):
    raise _megatron_only("megatron_lm parse_llama_config", _CONFIG)


def parse_glm4_moe_config(megatron_lm_plugin, model, batch_data):
    raise _megatron_only("megatron_lm parse_glm4_moe_config", _CONFIG)


# Accelerate's model types -> the Megatron-LM argument parser for each (every one refuses when called).
MODEL_CONFIGS_TO_MEGATRON_PARSERS = {
    "megatron-bert": parse_bert_config, "gpt2": parse_gpt2_config, "t5": parse_t5_config,
    "llama": parse_llama_config, "glm4_moe": parse_glm4_moe_config,
}
