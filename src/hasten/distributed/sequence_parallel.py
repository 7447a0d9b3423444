"""Ulysses sequence parallelism on the mesh (`ParallelismConfig(sp_size=n, sp_backend="hasten")`, beyond Accelerate).

Each rank of an `sp` group holds 1/n of every sequence (the prepared loaders cut it: `hasten.data.sequence_shard`).
Everything outside attention is per token, so it runs on the slice as it is. Around the attention call one
all-to-all turns the (batch, heads, seq/n, dim) slices into (batch, heads/n, seq, dim): each rank then attends over
the whole sequence for its share of the heads, and a second all-to-all turns the output back. Both are autograd
functions (the backward of one all-to-all is the reverse one), so gradients are exact.

The ranks of an sp group hold the same weights. Their gradients must be added up, not averaged, to give the
gradient of the whole sequence: the loss of each rank is the mean over the whole sequence, made by
`sequence_parallel_loss` (an all-reduce whose backward adds the sp ranks' gradients, as DeepSpeed's ALST recipe
does with its all-gather), and DDP/FSDP2 then average over every rank (sp ranks included: FSDP2 shards over the
flattened ("dp_shard", "sp") view), which makes it the mean over the data-parallel batches.

Attention is causal over the whole sequence (a decoder's): padding must be on the right (the loaders pad there, with
labels ignored), where causal attention never lets a real token see it.

Use: `ulysses_attention(fn)` wraps any attention function `fn(module, query, key, value, attention_mask, **kw)`
with transformers' layout (query (batch, heads, seq, dim) in, output (batch, seq, heads, dim) out);
`register_with_transformers(model)` (done by `prepare`) wraps the model's own attention implementation and
switches the model to it through transformers' `AttentionInterface`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..core.errors import ConfigError, NotBuiltError

ATTENTION_NAME = "hasten_ulysses"  # the name registered in transformers' AttentionInterface
# How many attention calls `ulysses_attention` has run over the whole sequence in this process: a prepared model's
# forward must move it (`watch_forward`), or its attention saw only this rank's slice.
_whole_sequence_calls = [0]


# -- the layouts it runs in -------------------------------------------------------------------------------------
def check_layout(config, deepspeed: bool) -> None:
    """Refuse, in one line each, the layouts sequence parallelism does not run in."""
    if not config.native_sp_enabled:
        return
    if deepspeed:
        raise ConfigError(f"In order to use the configured sp_size={config.sp_size} with DeepSpeed, you need to "
                          "configure sp_backend='deepspeed', yet you configured it to be sp_backend='hasten'. "
                          "(hasten's Ulysses runs with DDP/FSDP2; DeepSpeed brings its own)")
    for dim in ("tp", "pp"):
        if config._sizes[dim] > 1:
            raise NotBuiltError(f"ParallelismConfig sp_size={config.sp_size} with {dim}_size={config._sizes[dim]}: "
                                f"hasten's Ulysses composes with dp_replicate and dp_shard only; fix: leave {dim}_size "
                                "at 1")


def _no_run_layout():
    return None


# The ParallelismConfig of the run in this process, or None: `hasten.state` points this at the shared
# AcceleratorState's when it is imported (the state stands above this package; no state, no run, no sp).
run_layout = _no_run_layout


def sp_group(state=None):
    """The process group of this rank's sp group (hasten's Ulysses; None when sp is off). Without `state`, the
    run's layout (the shared AcceleratorState's), as Accelerate's helpers read the shared state."""
    config = run_layout() if state is None else getattr(state, "parallelism_config", None)
    if config is None or not config.native_sp_enabled:
        return None
    return config.submesh("sp").get_group()


def _refuse_recurrent_layers_under_sequence_parallelism(model: torch.nn.Module) -> None:
    """Raise ValueError when `model.config.layer_types` (of its text config, for multimodal models) lists a
    linear-attention layer. Sequence parallelism gathers the whole sequence only inside attention; a
    linear-attention layer carries a state along the sequence in its own code, so each rank would restart it from
    zero and the gradients would be wrong without any error. (Accelerate's tests import it from
    hasten.big_modeling, which re-exports it.)"""
    config = getattr(model, "config", None)
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    recurrent = sorted({kind for kind in getattr(config, "layer_types", None) or [] if "linear_attention" in kind})
    if recurrent:
        raise ValueError(
            f"Sequence parallelism does not support attention layers of type {recurrent} (model "
            f"{type(model).__name__}): they carry a recurrent state along the sequence that sharding would restart "
            "on every rank, giving wrong gradients silently. Use a full-attention model or turn sequence "
            "parallelism off (sp_size=1)."
        )


# -- the all-to-all ---------------------------------------------------------------------------------------------
def _all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group) -> torch.Tensor:
    """Cut `x` into the group's size along `scatter_dim`, send piece i to rank i, and join what comes back along
    `gather_dim` in rank order."""
    size = dist.get_world_size(group)
    if x.shape[scatter_dim] % size:
        raise ConfigError(f"sequence parallelism: dimension {scatter_dim} of size {x.shape[scatter_dim]} does not "
                          f"divide by sp_size={size}")
    sent = torch.stack(x.chunk(size, dim=scatter_dim)).contiguous()
    received = torch.empty_like(sent)
    dist.all_to_all_single(received, sent, group=group)
    return torch.cat(received.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, group):
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad.contiguous(), gather_dim, scatter_dim, ctx.group), None, None, None


def seq_to_heads(x: torch.Tensor, group, seq_dim: int = 2, head_dim: int = 1) -> torch.Tensor:
    """(…, heads, seq/n, …) slices -> (…, heads/n, seq, …), autograd-correct."""
    return _AllToAll.apply(x, head_dim, seq_dim, group)


def heads_to_seq(x: torch.Tensor, group, seq_dim: int = 1, head_dim: int = 2) -> torch.Tensor:
    """(…, seq, heads/n, …) -> (…, seq/n, heads, …), the way back, autograd-correct."""
    return _AllToAll.apply(x, seq_dim, head_dim, group)


def _causal_mask(length: int, like: torch.Tensor) -> torch.Tensor:
    """An additive (1, 1, length, length) causal mask in the dtype of `like` (eager and SDPA both take it)."""
    blocked = torch.ones(length, length, dtype=torch.bool, device=like.device).triu(1)
    mask = torch.zeros(length, length, dtype=like.dtype, device=like.device)
    return mask.masked_fill(blocked, torch.finfo(like.dtype).min)[None, None]


def ulysses_attention(attention, group=None):
    """Wrap `attention(module, query, key, value, attention_mask, **kwargs) -> (output, weights)` (transformers'
    attention-function layout) so that it attends over the whole sequence from sequence-sharded inputs.

    `group`: the sp process group (None: the running Accelerator's). The head counts of query and key/value must
    divide by the group's size. The incoming mask (built for the local slice) is dropped: a function that takes
    `is_causal` (transformers' SDPA) gets `is_causal=True` and no mask, any other a causal mask over the whole
    sequence; a module with `is_causal = False` is refused."""

    def wrapped(module, query, key, value, attention_mask=None, **kwargs):
        ranks = group if group is not None else sp_group()
        if ranks is None:  # not in a sequence-parallel run (evaluation in one process, say): the plain function
            return attention(module, query, key, value, attention_mask, **kwargs)
        if getattr(module, "is_causal", True) is False:
            raise NotBuiltError(f"sequence parallelism (sp_backend='hasten') on {type(module).__name__}: only causal "
                                "attention is built (the whole-sequence mask of a non-causal layer is not gathered); "
                                "fix: sp_size=1 for this model")
        size = dist.get_world_size(ranks)
        for name, tensor in (("query", query), ("key/value", key)):
            if tensor.shape[1] % size:
                raise ConfigError(f"sequence parallelism: {tensor.shape[1]} {name} heads do not divide by "
                                  f"sp_size={size}; fix: an sp_size that divides the model's key/value heads")
        q, k, v = (seq_to_heads(t, ranks) for t in (query, key, value))
        _whole_sequence_calls[0] += 1
        kwargs.pop("is_causal", None)
        if takes_is_causal:  # SDPA-like: its causal kernel (O(seq) memory on CPU too), no mask to materialise
            output, weights = attention(module, q, k, v, None, is_causal=True, **kwargs)
        else:
            output, weights = attention(module, q, k, v, _causal_mask(q.shape[2], q), **kwargs)
        return heads_to_seq(output, ranks), weights

    import inspect

    try:
        takes_is_causal = "is_causal" in inspect.signature(attention).parameters
    except (TypeError, ValueError):  # a builtin without a signature: the mask works everywhere
        takes_is_causal = False
    wrapped.__wrapped__ = attention
    return wrapped


def prepare_model(model) -> None:
    """What `prepare` does to a model under hasten's Ulysses: refuse a model whose layers carry a state along the
    sequence, route its attention through the all-to-all wrapper, and watch that its forwards use it."""
    _refuse_recurrent_layers_under_sequence_parallelism(model)
    register_with_transformers(model)
    watch_forward(model)


def watch_forward(model) -> None:
    """Refuse, in one line at the end of the forward, a forward of `model` under sequence parallelism in which
    `ulysses_attention` never ran: each rank then attended only to its own slice of the sequence and trained on
    silently wrong results (a plain `nn.Module`, whose attention hasten cannot find, did exactly that)."""
    if getattr(model, "_hasten_sp_watched", False):
        return
    starts = []  # the count at each forward's start (a stack: a forward may call the model again)

    def before(module, args):
        starts.append(_whole_sequence_calls[0])

    def after(module, args, output):
        start = starts.pop() if starts else _whole_sequence_calls[0]
        if _whole_sequence_calls[0] > start:
            return
        group = sp_group()
        if group is None:
            return
        raise ConfigError(
            f"sequence parallelism (sp_size={dist.get_world_size(group)}): the forward of {type(module).__name__} ran "
            "without hasten's sequence-parallel attention, so each rank attended only to its own slice of the "
            "sequence (wrong results); fix: a transformers model (attn_implementation 'sdpa' or 'eager'), or wrap "
            "the model's attention function with hasten.distributed.sequence_parallel.ulysses_attention"
        )

    model.register_forward_pre_hook(before)
    model.register_forward_hook(after)
    model._hasten_sp_watched = True


def register_with_transformers(model, group=None) -> None:
    """Switch a transformers model to `ulysses_attention` around its current attention implementation (through
    `AttentionInterface`, under the name "hasten_ulysses:<implementation>"). Models without a transformers config
    are left alone: wrap their attention with `ulysses_attention` yourself."""
    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if current is None or not hasattr(model, "set_attn_implementation"):
        return
    if current.startswith(ATTENTION_NAME):
        return
    import sys

    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if current == "eager":  # not in the registry: each model file has its own eager_attention_forward
        inner = next((sys.modules[type(m).__module__].eager_attention_forward for m in model.modules()
                      if hasattr(sys.modules.get(type(m).__module__), "eager_attention_forward")), None)
    else:
        inner = ALL_ATTENTION_FUNCTIONS.get(current)
    if inner is None:
        raise NotBuiltError(f"sequence parallelism (sp_backend='hasten'): the model's attention implementation "
                            f"{current!r} is not one transformers registers; fix: attn_implementation='sdpa' or 'eager'")
    name = f"{ATTENTION_NAME}:{current}"
    AttentionInterface.register(name, ulysses_attention(inner, group))
    model.set_attn_implementation(name)


# -- the loss ---------------------------------------------------------------------------------------------------
class _SumOverGroup(torch.autograd.Function):
    """All-reduce (sum) whose backward is the same all-reduce: every rank's copy of the total feeds back into every
    rank's part, which adds up the sp ranks' gradients."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def sequence_parallel_loss(loss: torch.Tensor, num_items, group=None) -> torch.Tensor:
    """The mean loss over the whole sequence of the sp group, from this rank's `loss` (its mean over its
    `num_items` items; a rank with none gives 0 weight to whatever finite value it passes), on every rank, and
    differentiable (the sp ranks' gradients add up). Without sequence parallelism: `loss` itself."""
    ranks = group if group is not None else sp_group()
    if ranks is None:
        return loss
    items = torch.as_tensor(num_items, dtype=torch.float32, device=loss.device).reshape(())
    total_items = items.clone()
    dist.all_reduce(total_items, group=ranks)
    part = torch.where(items > 0, loss.float() * items, torch.zeros((), device=loss.device))
    return _SumOverGroup.apply(part, ranks) / total_items.clamp(min=1)


def causal_lm_loss(logits: torch.Tensor, shift_labels: torch.Tensor, ignore_index: int = -100, group=None):
    """Cross-entropy of `logits` against this rank's `shift_labels` (the sequence-sharded loaders make them), as
    the mean over every non-ignored token of the whole sequence; safe on a rank whose slice is all padding."""
    logits = logits.float().reshape(-1, logits.shape[-1])
    labels = shift_labels.reshape(-1).to(logits.device)
    summed = torch.nn.functional.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="sum")
    items = (labels != ignore_index).sum()
    ranks = group if group is not None else sp_group()
    if ranks is None:
        return summed / items.clamp(min=1)
    total_items = items.float()
    dist.all_reduce(total_items, group=ranks)
    return _SumOverGroup.apply(summed, ranks) / total_items.clamp(min=1)


__all__ = ["_refuse_recurrent_layers_under_sequence_parallelism", "causal_lm_loss", "heads_to_seq", "register_with_transformers", "seq_to_heads", "sequence_parallel_loss",
           "sp_group", "ulysses_attention", "watch_forward"]
