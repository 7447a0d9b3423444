"""Tensor parallelism for any `nn.Module`: which layers to split (a plan) and splitting them on the `tp` mesh
dimension with torch.distributed.tensor.parallel.

A plan maps module paths (`*` stands for one path component, e.g. `layers.*.attn.q_proj`) to a style name:

    colwise        ColwiseParallel: the weight is split by output features; the output stays split
    rowwise        RowwiseParallel: split by input features (an nn.Embedding: by vocabulary); output summed
    colwise_rep    ColwiseParallel whose output is gathered whole (an output head)
    rowwise_rep    RowwiseParallel with a whole output (the same as rowwise)
    sequence_parallel  SequenceParallel (norms and dropouts on sequence-split activations)
    replicate / local  left whole on every rank

or to a ParallelStyle object. Where the plan comes from, first found: the user's
(`TorchTensorParallelConfig(tp_plan=...)`), the model's own (transformers' `tp_plan` / `_tp_plan`), else the
automatic plan built here from the module structure (`automatic_plan`, documented in docs/parallelism.md).
"""

from __future__ import annotations

import re

import torch

from ..core.errors import ConfigError

STYLE_NAMES = ("colwise", "rowwise", "colwise_rep", "rowwise_rep", "sequence_parallel", "replicate", "local")

# Integer attributes an attention module reshapes by: divided by the tp size when its projections are split.
HEAD_COUNT_ATTRIBUTES = ("num_heads", "n_heads", "n_head", "nhead", "num_attention_heads", "num_key_value_heads",
                         "num_kv_heads", "n_kv_heads", "n_kv_head", "n_local_heads", "n_local_kv_heads")
# Names of the projection that brings a block back to the model width (decides when structure cannot).
_OUTPUT_NAMES = re.compile(r"^(o_proj|out_proj|c_proj|down_proj|w2|fc2|wo|dense_4h_to_h|proj_out|proj|output|down)$")
# Fused q/k/v projections: splitting them by output features would mix the three.
_FUSED_NAMES = re.compile(r"^(c_attn|qkv|qkv_proj|Wqkv|query_key_value|in_proj|w_qkv)$")


def _style(name_or_style, where: str, module=None):
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, SequenceParallel

    if isinstance(name_or_style, ParallelStyle):
        return name_or_style
    styles = {
        "colwise": ColwiseParallel, "rowwise": RowwiseParallel,
        "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
        "rowwise_rep": lambda: RowwiseParallel(output_layouts=Replicate()),
        "sequence_parallel": SequenceParallel, "replicate": None, "local": None,
    }
    if name_or_style not in styles:
        raise ConfigError(f"tensor parallel plan entry {where!r}: style {name_or_style!r} is not one hasten knows; use "
                          f"one of {', '.join(STYLE_NAMES)} or a torch ParallelStyle object")
    if isinstance(module, torch.nn.Embedding) and name_or_style in ("rowwise", "rowwise_rep"):
        return RowwiseParallel(input_layouts=Replicate())  # token ids arrive whole on every rank
    make = styles[name_or_style]
    return make() if make is not None else None


def _pattern(key: str):
    """`layers.*.q_proj` -> a regex over module paths (`*` is one path component)."""
    return re.compile("^" + r"[^.]+".join(re.escape(part) for part in key.split("*")) + "$")


def model_plan(model: torch.nn.Module):
    """The plan a model carries (transformers' `tp_plan` property or `_tp_plan` attribute), or None."""
    for attribute in ("tp_plan", "_tp_plan"):
        plan = getattr(model, attribute, None)
        if isinstance(plan, dict) and plan:
            return dict(plan)
    return None


def resolve_plan(model: torch.nn.Module, plan: dict, tp_size: int) -> dict:
    """`{module path: style}` for the modules `plan`'s patterns name (every pattern must name at least one)."""
    if not isinstance(plan, dict) or not plan:
        raise ConfigError(f"a tensor parallel plan must be a non-empty dict of module path -> style, got {plan!r}")
    names = [name for name, _ in model.named_modules() if name]
    resolved = {}
    for key, style in plan.items():
        pattern = _pattern(key)
        hits = [name for name in names if pattern.match(name)]
        if not hits:
            raise ConfigError(f"tensor parallel plan entry {key!r} matches no module of {type(model).__name__}; "
                              "fix the path (module names as in model.named_modules(), '*' for one component)")
        for name in hits:
            resolved.setdefault(name, style)
    modules = dict(model.named_modules())
    for name, style in resolved.items():
        _check_divisible(name, modules[name], style, tp_size)
    return resolved


def _check_divisible(name: str, module, style, tp_size: int) -> None:
    if isinstance(style, str) and style in ("colwise", "colwise_rep"):
        size = getattr(module, "out_features", None) or getattr(module, "num_embeddings", None)
    elif isinstance(style, str) and style in ("rowwise", "rowwise_rep"):
        size = getattr(module, "in_features", None) or getattr(module, "num_embeddings", None)
    else:
        return
    if size is not None and size % tp_size:
        raise ConfigError(f"tensor parallel: module {name!r} ({type(module).__name__}) has {size} features to split "
                          f"{style}, which tp_size={tp_size} does not divide; change tp_size or leave it out of the plan")


# -- the automatic plan ---------------------------------------------------------------------------------------------
def _linear_children(module) -> list:
    return [(name, child) for name, child in module.named_children() if type(child) is torch.nn.Linear]


def _pair(module) -> tuple | None:
    """(inputs, output) when `module`'s direct Linear children form a block whose inputs read the model width and
    whose output projection brings it back (attention q/k/v + o, MLP up/gate + down), else None."""
    linears = _linear_children(module)
    if len(linears) < 2:
        return None
    candidates = []
    for name, out in linears:
        others = [(n, lin) for n, lin in linears if lin is not out]
        if all(lin.in_features == out.out_features for _, lin in others) and \
                any(lin.out_features == out.in_features for _, lin in others):
            candidates.append(name)
    if not candidates:
        return None
    named = [name for name in candidates if _OUTPUT_NAMES.match(name)]
    # Structure first; a name breaks a tie (q and o of equal width); else the last registered one (forward order).
    output = named[0] if len(named) == 1 else (candidates[0] if len(candidates) == 1 else candidates[-1])
    inputs = [name for name, _ in linears if name != output]
    return inputs, output


def _touches_split_width(module, widths: set) -> str | None:
    """A parameterized child (other than the Linears) whose size is a split width would see a partial tensor."""
    for name, child in module.named_children():
        if type(child) is torch.nn.Linear:
            continue
        for param in child.parameters():
            if param.shape and param.shape[-1] in widths:
                return name
    return None


def automatic_plan(model: torch.nn.Module, tp_size: int) -> tuple[dict, dict]:
    """(plan, head counts to divide) for a plain PyTorch model, from its structure (docs/parallelism.md):

    - a module whose direct Linear children are inputs (all reading the width the output projection writes) and one
      output projection (reading what an input writes): inputs colwise, output rowwise. Attention (q/k/v + o) and MLPs
      (up/gate + down, w1/w3 + w2, fc1 + fc2) have this shape;
    - every nn.Embedding not tied to a Linear: rowwise (split by vocabulary);
    - the model's last Linear, when it is in no block and widens (an output head): colwise with a whole output.
    Refused in one line: nn.MultiheadAttention and fused q/k/v projections (naming the module), head counts or widths
    tp_size does not divide.
    """
    plan: dict = {}
    heads: dict = {}
    paired: set = set()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.MultiheadAttention):
            raise ConfigError(f"tensor parallel: {name or 'the model'} is an nn.MultiheadAttention, whose fused "
                              "in_proj hasten cannot split; write q/k/v/out as separate nn.Linear layers, or give a "
                              "plan that leaves it out (TorchTensorParallelConfig(tp_plan=...))")
        for child_name, child in _linear_children(module):
            if _FUSED_NAMES.match(child_name) and child.out_features == 3 * child.in_features:
                path = f"{name}.{child_name}" if name else child_name
                raise ConfigError(f"tensor parallel: {path} is a fused q/k/v projection ({child.in_features} -> "
                                  f"{child.out_features}), which a column split would mix up; split it into three "
                                  "nn.Linear layers, or give a plan (TorchTensorParallelConfig(tp_plan=...))")
        found = _pair(module)
        if found is None:
            continue
        inputs, output = found
        children = dict(module.named_children())
        widths = {children[n].out_features for n in inputs}
        blocker = _touches_split_width(module, widths)
        if blocker is not None:
            continue  # e.g. a norm over the hidden width between up and down: left whole, still correct
        prefix = f"{name}." if name else ""
        for child in inputs:
            plan[prefix + child] = "colwise"
        plan[prefix + output] = "rowwise"
        paired.update(id(children[n]) for n in (*inputs, output))
        for attribute in HEAD_COUNT_ATTRIBUTES:
            value = getattr(module, attribute, None)
            if isinstance(value, int) and not isinstance(value, bool):
                if value % tp_size:
                    raise ConfigError(f"tensor parallel: {name or 'the model'}.{attribute}={value} attention heads, "
                                      f"which tp_size={tp_size} does not divide; choose a tp_size that divides it")
                heads[(name, attribute)] = value // tp_size
    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Embedding) and id(module.weight) not in linear_weights \
                and module.num_embeddings % tp_size == 0 and name:
            plan[name] = "rowwise"
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    if linears:
        name, head = linears[-1]
        embedding_weights = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
        if id(head) not in paired and name and head.out_features > head.in_features \
                and head.out_features % tp_size == 0 and id(head.weight) not in embedding_weights:
            plan[name] = "colwise_rep"
    if not plan:
        raise ConfigError(f"tensor parallel: the automatic plan found nothing to split in {type(model).__name__} (no "
                          "block of nn.Linear layers that read and write the same width, no embedding, no output head); "
                          "give a plan: TorchTensorParallelConfig(tp_plan={'path.to.linear': 'colwise', ...})")
    modules = dict(model.named_modules())
    for name, style in plan.items():
        _check_divisible(name, modules[name], style, tp_size)
    return plan, heads


def plan_for(model: torch.nn.Module, tp_size: int, user_plan=None) -> tuple[dict, dict, str]:
    """(resolved plan, head counts to divide, where it came from: "user", "model" or "automatic")."""
    if user_plan is not None and user_plan != "auto":
        return resolve_plan(model, user_plan, tp_size), {}, "user"
    own = model_plan(model) if user_plan is None else None
    if own is not None:
        return resolve_plan(model, own, tp_size), {}, "model"
    plan, heads = automatic_plan(model, tp_size)
    return plan, heads, "automatic"


def apply_tensor_parallel(model: torch.nn.Module, tp_mesh, user_plan=None) -> dict:
    """Split `model` in place over the 1-D `tp_mesh`; returns the plan applied (`{module path: style}`)."""
    from torch.distributed.tensor.parallel import parallelize_module

    plan, heads, _ = plan_for(model, tp_mesh.size(), user_plan)
    modules = dict(model.named_modules())
    for name, style in plan.items():
        parallel_style = _style(style, name, modules[name])
        if parallel_style is not None:
            parallelize_module(modules[name], tp_mesh, parallel_style)
    for (name, attribute), value in heads.items():
        setattr(modules[name], attribute, value)  # each rank now runs value heads
    return plan


def model_has_dtensor(model: torch.nn.Module) -> bool:
    """Whether any parameter of `model` is a DTensor (split by tensor parallelism or sharded by FSDP2)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def get_model_tp_size(model: torch.nn.Module):
    """The tensor parallel size a model was split with: transformers' `model.tp_size` or
    `model.config.distributed_config.tp_size`, else the size of the `tp` mesh dimension its parameters live on;
    None when it was not split."""
    size = getattr(model, "tp_size", None)
    if size is not None:
        return size
    config = getattr(getattr(model, "config", None), "distributed_config", None)
    size = config.get("tp_size") if isinstance(config, dict) else getattr(config, "tp_size", None)
    if size is not None:
        return size
    from torch.distributed.tensor import DTensor

    for param in model.parameters():
        if isinstance(param, DTensor) and "tp" in (param.device_mesh.mesh_dim_names or ()):
            return param.device_mesh.size(param.device_mesh.mesh_dim_names.index("tp"))
    return None


__all__ = ["apply_tensor_parallel", "automatic_plan", "get_model_tp_size", "model_has_dtensor", "plan_for"]
