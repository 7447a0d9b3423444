"""Pipeline parallelism for training: cut a sequence of blocks into stages, run them with one of
`torch.distributed.pipelining`'s schedules, and keep Accelerate's loop (`loss = model(x, labels=y)`).

What counts as "a sequence of blocks": an `nn.Sequential` (nested `nn.Sequential`s are looked into, so
`Sequential(embed, Sequential(*layers), head)` has len(layers) + 2 blocks). Its forward is the blocks applied in
order, so any contiguous run of them is a stage whose output is the next stage's input. A model with its own
`forward` cannot be cut without tracing it; it is refused in one line (express it as `nn.Sequential`).

A stage keeps the names the blocks had in the whole model (`1.3.attn.q_proj.weight`), so checkpoints written by
N stages hold the same keys as one process's and load across pipeline layouts.

The schedule does forward and backward over the micro-batches itself; the loss it back-propagates is divided by
(micro-batches x accumulation steps), so gradients add up to those of the mean loss over the whole batch and
window, as one process computing `loss.backward()` on the whole batch. torch's own `scale_grads` (dividing every
gradient after the step) is off: it would also divide the gradients kept from earlier micro-steps of a window.
"""

from __future__ import annotations

import torch
from torch import nn

from ..core.enums import PP_SINGLE_STAGE_SCHEDULES, PP_V_SCHEDULES
from ..core.errors import PipelineCallError, PipelineSplitError


# -- the blocks of a model and where to cut -----------------------------------------------------------------------
def _is_plain_sequential(module) -> bool:
    return isinstance(module, nn.Sequential) and type(module).forward is nn.Sequential.forward


def pipeline_blocks(model: nn.Module) -> list:
    """[(name, block)] in the order the model applies them: the leaves of its nested `nn.Sequential`s."""
    if not _is_plain_sequential(model):
        raise PipelineSplitError(
            f"pipeline parallelism cuts a model into stages between its blocks, but {type(model).__name__} has its own "
            "forward that hasten cannot cut; fix: express it as nn.Sequential(embedding, *blocks, head) (nested "
            "nn.Sequential are fine)")
    blocks = []

    def walk(container, prefix):
        for name, child in container._modules.items():
            if child is None:
                continue
            if _is_plain_sequential(child):
                walk(child, f"{prefix}{name}.")
            else:
                blocks.append((f"{prefix}{name}", child))

    walk(model, "")
    return blocks


def balanced_split(weights: list, num_stages: int) -> list:
    """The start index of each stage after the first: contiguous, non-empty, the largest stage as small as
    possible (dynamic programming over the prefix sums; models have at most a few hundred blocks)."""
    n = len(weights)
    prefix = [0]
    for weight in weights:
        prefix.append(prefix[-1] + weight)
    inf = float("inf")
    # best[s][i]: the smallest largest-stage over cutting the first i blocks into s stages; cut[s][i]: its last cut
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0
    for s in range(1, num_stages + 1):
        for i in range(s, n + 1):
            for j in range(s - 1, i):
                value = max(best[s - 1][j], prefix[i] - prefix[j])
                if value < best[s][i]:
                    best[s][i], cut[s][i] = value, j
    starts, i = [], n
    for s in range(num_stages, 0, -1):
        i = cut[s][i]
        starts.append(i)
    return sorted(starts)[1:]


def stage_blocks(model: nn.Module, num_stages: int, split_points=None) -> list:
    """For each stage, the names of its blocks. `split_points`: the block (name or index) each stage after the
    first starts with, as torchtitan's `pipeline_parallel_split_points`; None: balanced by parameter count."""
    blocks = pipeline_blocks(model)
    names = [name for name, _ in blocks]
    if len(blocks) < num_stages:
        raise PipelineSplitError(f"the model has {len(blocks)} blocks, fewer than the {num_stages} pipeline stages; "
                                 "fix: a smaller pp_size (or fewer stages per process), or a model with more blocks")
    if split_points is None:
        starts = balanced_split([sum(p.numel() for p in block.parameters()) for _, block in blocks], num_stages)
    else:
        starts = []
        for point in split_points:
            if isinstance(point, int) and not isinstance(point, bool):
                index = point
            elif point in names:
                index = names.index(point)
            else:
                raise PipelineSplitError(f"pipeline split point {point!r} is not a block of the model; its blocks are "
                                         f"{', '.join(names[:12])}{' ...' if len(names) > 12 else ''}")
            starts.append(index)
        if len(starts) != num_stages - 1 or starts != sorted(set(starts)) or not 0 < starts[0] or starts[-1] >= len(names):
            raise PipelineSplitError(f"pipeline split points {list(split_points)} must be {num_stages - 1} increasing "
                                     f"blocks after the first (one per stage boundary, {num_stages} stages)")
    bounds = [0, *starts, len(names)]
    return [names[bounds[s]:bounds[s + 1]] for s in range(num_stages)]


def prune(model: nn.Module, keep: set) -> nn.Sequential:
    """A new `nn.Sequential` tree holding only the blocks named in `keep`, under their names in `model` (the
    blocks are the same objects, not copies)."""
    def build(container, prefix):
        kept = nn.Sequential()
        for name, child in container._modules.items():
            path = f"{prefix}{name}"
            if path in keep:
                kept._modules[name] = child
            elif child is not None and _is_plain_sequential(child) and any(k.startswith(path + ".") for k in keep):
                kept._modules[name] = build(child, path + ".")
        return kept

    return build(model, "")


def stages_of_rank(pp_rank: int, pp_size: int, stages_per_rank: int, schedule: str) -> list:
    """The stage indices one pipeline rank runs: r, r+pp, ... (loop order) or r, 2*pp-1-r (V schedules)."""
    if schedule in PP_V_SCHEDULES:
        return [pp_rank, 2 * pp_size - 1 - pp_rank]
    return [pp_rank + k * pp_size for k in range(stages_per_rank)]


def stages_per_rank_for(schedule: str, asked) -> int:
    if schedule in PP_SINGLE_STAGE_SCHEDULES:
        if asked not in (None, 1):
            raise PipelineSplitError(f"pipeline schedule {schedule!r} runs one stage per process, not "
                                     f"stages_per_rank={asked}; fix: an interleaved schedule (e.g. 'Interleaved1F1B')")
        return 1
    if schedule in PP_V_SCHEDULES and asked not in (None, 2):
        raise PipelineSplitError(f"pipeline schedule {schedule!r} places exactly 2 stages per process in a V, not "
                                 f"stages_per_rank={asked}; fix: leave stages_per_rank unset")
    return asked or 2


def refuse_unstartable_schedule(schedule: str, group) -> None:
    """A V schedule over gloo on torch without the stages' warm-up vote (torch 2.11; 2.13 has it) cannot start:
    torch's set-up sends from the rank of the two middle stages to itself, which gloo refuses with "Pair is not
    connected" on every rank. Refused here in one line instead."""
    import torch.distributed as dist

    if schedule in PP_V_SCHEDULES and not schedules_warm_up_by_vote() and dist.get_backend(group) == "gloo":
        raise PipelineSplitError(f"pipeline schedule {schedule!r} cannot start over gloo on torch {torch.__version__}: "
                                 "its set-up sends from one process to itself, which gloo cannot do; fix: "
                                 "'Interleaved1F1B' (or '1F1B'), or torch 2.13 or newer")


def schedules_warm_up_by_vote() -> bool:
    """Whether torch's multi-stage schedules start their stages with the warm-up vote (torch 2.13), not with
    sends to every neighbour stage, the middle stages of a V included (torch 2.11)."""
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti

    return hasattr(PipelineScheduleMulti, "_warmup_p2p")


def default_loss(output, labels):
    """Mean cross-entropy of logits (..., vocab) against labels (...), as a language model's train step."""
    return nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]).float(), labels.reshape(-1))


# -- the model the user's loop calls --------------------------------------------------------------------------------
class PipelinedModel(nn.Module):
    """This process's stages of a pipelined model. Its children are the blocks it runs, under their names in the
    whole model (so `state_dict` has the whole model's keys, restricted to these blocks).

    In training mode `model(inputs, labels=labels)` runs the schedule, forward and backward over the
    micro-batches, and returns the mean loss (on every process of the pipeline); `accelerator.backward` then has
    nothing to do. In eval mode it runs forward only and returns the last stage's output there (None on the other
    processes of the pipeline), or the mean loss when labels are given.
    """

    def __init__(self, view: nn.Sequential, chunks: list, stage_ids: list, num_stages: int, pp_group, pp_rank: int,
                 pp_size: int, schedule: str, microbatches: int, loss_fn, device, accumulation_steps):
        super().__init__()
        for name, child in view._modules.items():
            self._modules[name] = child
        self._chunks = chunks  # plain list: the blocks are registered once, above
        self._stage_ids = stage_ids
        self._num_stages = num_stages
        self._group = pp_group
        self._pp_rank, self._pp_size = pp_rank, pp_size
        self._schedule_name = schedule
        self._microbatches = microbatches
        self._loss_fn = loss_fn or default_loss
        self._device = device
        self._accumulation_steps = accumulation_steps  # a callable: the window's length when the schedule runs
        self._schedule = None
        self._shapes = None
        self._last_stage_rank = pp_size - 1 if schedule not in PP_V_SCHEDULES else 0

    @property
    def chunks(self) -> list:
        """The stage modules this process runs (one, or several for the interleaved and V schedules)."""
        return list(self._chunks)

    stage_ids = property(lambda self: list(self._stage_ids))
    schedule_name = property(lambda self: self._schedule_name)
    num_microbatches = property(lambda self: self._microbatches)

    def _build(self, shapes, scale: float):
        from torch.distributed import pipelining

        stages = [pipelining.PipelineStage(chunk, index, self._num_stages, self._device, group=self._group)
                  for chunk, index in zip(self._chunks, self._stage_ids)]
        cls = pipelining.schedules.get_schedule_class(self._schedule_name)
        loss_fn = _ScaledLoss(self._loss_fn, scale)
        if self._schedule_name in PP_SINGLE_STAGE_SCHEDULES:
            self._schedule = cls(stages[0], n_microbatches=self._microbatches, loss_fn=loss_fn, scale_grads=False)
        else:
            self._schedule = cls(stages, n_microbatches=self._microbatches, loss_fn=loss_fn, scale_grads=False)
        self._loss_scale = loss_fn
        self._shapes = shapes

    def forward(self, *args, labels=None, input_ids=None, **kwargs):
        if kwargs:
            raise PipelineCallError(f"a pipelined model takes the first stage's input and labels=..., not "
                                    f"{', '.join(sorted(kwargs))}; fix: pass other inputs inside the first block")
        if input_ids is not None:
            args = (input_ids, *args)
        if len(args) != 1 or not isinstance(args[0], torch.Tensor):
            raise PipelineCallError(f"a pipelined model takes one input tensor (the first stage's), got {len(args)} "
                                    "positional arguments; fix: model(inputs, labels=labels)")
        inputs = args[0]
        batch = inputs.shape[0]
        if batch % self._microbatches:
            raise PipelineCallError(f"a batch of {batch} samples cannot be cut into {self._microbatches} equal "
                                    "pipeline micro-batches; fix: a batch size that pipeline microbatches divides "
                                    "(or drop_last=True in the DataLoader)")
        if self.training and labels is None:
            raise PipelineCallError("a pipelined model in training mode runs forward and backward and needs the "
                                    "targets: call model(inputs, labels=labels) (or model.eval() for forward only)")
        steps = self._accumulation_steps() if self.training else 1
        scale = 1.0 / (self._microbatches * steps)
        shapes = (tuple(inputs.shape), inputs.dtype, None if labels is None else tuple(labels.shape))
        if self._schedule is None or self._shapes != shapes:
            self._build(shapes, scale)  # the stages learn the shapes they exchange on their first run
        self._loss_scale.scale = scale
        losses = []
        holds_last = (self._num_stages - 1) in self._stage_ids
        # Only the rank of stage 0 hands the schedule its inputs, and only the last stage's the targets: torch 2.11
        # refuses inputs on a later stage ("Can't supply input args for shape inference on non-first stage").
        # Contiguous, as the stages' shape inference assumes (torch 2.11 refuses a slice such as `ids[:, :-1]`).
        step_args = (inputs.contiguous(),) if 0 in self._stage_ids else ()
        step_kwargs = {}
        if holds_last:
            step_kwargs = {"target": None if labels is None else labels.contiguous(), "losses": losses}
        if self.training:
            output = self._schedule.step(*step_args, **step_kwargs)
        else:
            with torch.no_grad():
                output = self._schedule.eval(*step_args, **step_kwargs)
        if labels is None:
            return output
        loss = (torch.stack([l.detach().float() for l in losses]).sum() / scale / self._microbatches
                if holds_last else torch.zeros((), device=self._device))
        loss = loss.to(self._device).reshape(())
        import torch.distributed as dist

        dist.broadcast(loss, group=self._group, group_src=self._last_stage_rank)
        return loss


class _ScaledLoss:
    """The user's loss divided by (micro-batches x accumulation steps): the schedule back-propagates this."""

    def __init__(self, loss_fn, scale: float):
        self.loss_fn, self.scale = loss_fn, scale

    def __call__(self, output, target):
        return self.loss_fn(output, target) * self.scale


__all__ = ["PipelinedModel", "balanced_split", "default_loss", "pipeline_blocks", "prune", "stage_blocks",
           "stages_of_rank"]
