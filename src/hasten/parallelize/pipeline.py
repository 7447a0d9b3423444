"""Layout step: the pipeline split. The model is cut into stages over the layout's `pp` dimension
(`distributed/pipeline.py` picks the cut points and which stages each rank runs); this process keeps its own stages
and frees the other stages' parameters (the user's optimizer still holds them: the backend drops them there)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Stages:
    """This process's part of a pipelined model."""

    view: torch.nn.Module  # its stages as one module, names as in the whole model (state dicts, checkpoints)
    chunks: list  # one module per stage it runs (what the schedule drives)
    mine: list  # the indexes of those stages
    num_stages: int
    blocks: list  # its blocks, in the model's order
    dropped: frozenset  # ids of the parameters of the other stages (freed here)


def split_stages(model: torch.nn.Module, layout, device) -> Stages:
    """Cut `model` into `pp_size * stages_per_rank` stages and keep this process's, moved to `device`."""
    from ..distributed.pipeline import pipeline_blocks, prune, refuse_unstartable_schedule, stage_blocks, stages_of_rank

    handler, mesh = layout.pp_handler, layout.device_mesh
    refuse_unstartable_schedule(handler.schedule, mesh.get_group("pp"))
    pp_rank, pp_size = mesh.get_local_rank("pp"), layout.pp_size
    num_stages = pp_size * handler.stages_per_rank
    names = stage_blocks(model, num_stages, handler.split_points)
    mine = stages_of_rank(pp_rank, pp_size, handler.stages_per_rank, handler.schedule)
    keep = {name for stage in mine for name in names[stage]}
    blocks = dict(pipeline_blocks(model))
    kept_ids = {id(p) for name in keep for p in blocks[name].parameters()}
    dropped = set()
    for param in model.parameters():
        if id(param) not in kept_ids:  # another stage's: freed here
            dropped.add(id(param))
            param.data = torch.empty(0, dtype=param.dtype, device=param.device)
    view = prune(model, keep)
    view.to(device)
    chunks = [prune(model, set(names[stage])) for stage in mine]
    own = [blocks[name] for name in sorted(keep, key=list(blocks).index)]
    return Stages(view, chunks, mine, num_stages, own, frozenset(dropped))
