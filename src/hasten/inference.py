"""Pipeline-parallel inference on `torch.distributed.pipelining`: the model is cut into one stage per process,
each process holds only its stage, and a batch flows through the stages as `num_chunks` micro-batches (GPipe).

`prepare_pippy(model, example_args=(batch,))` traces the model once with a micro-batch cut from the example,
then replaces `model.forward`: the first process feeds the inputs, the last process returns the output
(every process does with `gather_output=True`), the others return None.
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Union

import torch

from .core.errors import ConfigError
from .distributed.operations import (
    broadcast_object_list,
    copy_tensor_to_devices,
    ignorant_find_batch_size,
    send_to_device,
)
from .state import PartialState
from .training.compilation import is_repeated_blocks


def _pipelining():
    try:
        import torch.distributed.pipelining as pipelining
    except ImportError as error:  # torch < 2.4
        raise ImportError("prepare_pippy needs torch.distributed.pipelining (torch>=2.4)") from error
    return pipelining


def _split_units(model: torch.nn.Module, no_split_module_classes) -> list[tuple[str, int]]:
    """(name, parameter bytes) of the pieces a stage boundary may fall between, in registration order.

    A piece is a leaf, a module of a class named in `no_split_module_classes`, each block of a repeated stack,
    or a module owning parameters directly (its code uses them, so it cannot be cut). Registration order
    stands in for execution order, which holds for the usual embed → blocks → head models."""
    keep_whole = set(no_split_module_classes or ())
    units: list[tuple[str, int]] = []

    def size(module):
        return sum(p.numel() * p.element_size() for p in module.parameters())

    def walk(prefix: str, module: torch.nn.Module, whole: bool):
        children = list(module.named_children())
        if prefix and (whole or not children or type(module).__name__ in keep_whole
                       or any(True for _ in module.parameters(recurse=False))):
            units.append((prefix, size(module)))
            return
        repeated = is_repeated_blocks(module)
        for name, child in children:
            walk(f"{prefix}.{name}" if prefix else name, child, repeated)

    walk("", model, False)
    return units


def generate_split_points(model: torch.nn.Module, num_stages: int, no_split_module_classes=None) -> list[str]:
    """Names of the `num_stages - 1` modules that begin stages 1..n-1, balancing parameter bytes per stage."""
    units = _split_units(model, no_split_module_classes)
    if len(units) < num_stages:
        raise ConfigError(
            f"prepare_pippy cannot cut {type(model).__name__} into {num_stages} stages: it has only {len(units)} "
            "splittable modules; pass split_points=[...] or use fewer processes"
        )
    total = sum(size for _, size in units) or 1
    points, before = [], 0  # before: parameter bytes of the pieces ahead of this one
    for index, (name, unit_size) in enumerate(units):
        needed = num_stages - 1 - len(points)
        if index > 0 and needed > 0:
            # Begin the next stage at the piece that straddles the running share, or when every piece left must.
            share_met = before + unit_size / 2 >= total * (len(points) + 1) / num_stages
            if share_met or len(units) - index == needed:
                points.append(name)
        before += unit_size
    return points


def generate_device_map(model, num_processes: int = 1, no_split_module_classes=None, max_memory=None) -> dict:
    """Which process holds each splittable module: `{module name: process index}`, in order. Without
    `max_memory`, balanced by parameter bytes; with it (`{process index: bytes or "10GB"}`), each process takes
    pieces in order while they fit its budget, and a piece that fits nowhere is refused."""
    if max_memory is not None:
        return _device_map_within(model, num_processes, no_split_module_classes, max_memory)
    points = generate_split_points(model, num_processes, no_split_module_classes) if num_processes > 1 else []
    device_map, stage = {}, 0
    for name, _ in _split_units(model, no_split_module_classes):
        if stage < len(points) and name == points[stage]:
            stage += 1
        device_map[name] = stage
    return device_map


def _device_map_within(model, num_processes: int, no_split_module_classes, max_memory: dict) -> dict:
    from .big_model.device_map import convert_file_size_to_int

    budgets = [convert_file_size_to_int(max_memory[i]) if i in max_memory else 0 for i in range(num_processes)]
    device_map, stage, used = {}, 0, 0
    for name, size in _split_units(model, no_split_module_classes):
        while stage < num_processes and used + size > budgets[stage]:
            stage, used = stage + 1, 0
        if stage == num_processes:
            raise ConfigError(
                f"generate_device_map: module {name!r} ({size} bytes) fits in no process's max_memory after the "
                f"earlier pieces (budgets {budgets} bytes for processes 0..{num_processes - 1}); fix: raise max_memory"
            )
        device_map[name], used = stage, used + size
    return device_map


def find_pippy_batch_size(args, kwargs) -> Optional[int]:
    """The batch size of the first tensor found in `args`, then in `kwargs` (None if there is none)."""
    for value in list(args or ()) + list((kwargs or {}).values()):
        found = ignorant_find_batch_size(value)
        if found is not None:
            return found
    return None


def _first_chunk(data, batch_size: int, num_chunks: int):
    """The first micro-batch of every tensor whose first dimension is the batch."""
    chunk = batch_size // num_chunks

    def cut(value):
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == batch_size:
            return value[:chunk]
        if isinstance(value, (list, tuple)):
            return type(value)(cut(v) for v in value)
        if isinstance(value, dict):
            return {k: cut(v) for k, v in value.items()}
        return value

    return cut(data)


def build_pipeline(model, split_points, args, kwargs, num_chunks):
    """Trace `model` with micro-batch example inputs, cut it before each split point, and return the GPipe
    schedule of this process's stage."""
    pipelining = _pipelining()
    state = PartialState()
    split_spec = {name: pipelining.SplitPoint.BEGINNING for name in split_points}
    pipe = pipelining.pipeline(model, mb_args=tuple(args), mb_kwargs=kwargs or None, split_spec=split_spec)
    if pipe.num_stages != state.num_processes:
        raise ConfigError(
            f"prepare_pippy made {pipe.num_stages} stages from split_points={list(split_points)} but runs on "
            f"{state.num_processes} processes; give exactly {state.num_processes - 1} split points"
        )
    stage = pipe.build_stage(state.process_index, device=state.device)
    return pipelining.ScheduleGPipe(stage, num_chunks)


def pippy_forward(forward, num_chunks, gather_output, *args, expected_batch_size=None, **kwargs):
    """One pipelined call: the first process feeds, the last returns the output, the others return None."""
    state = PartialState()
    if state.num_processes == 1:
        return forward(*args, **kwargs)
    output = None
    if state.is_main_process:
        batch_size = find_pippy_batch_size(args, kwargs)
        if batch_size is None:
            raise ConfigError("the pipelined model found no tensor with a batch dimension in its inputs")
        if expected_batch_size is not None and batch_size != expected_batch_size:
            raise ConfigError(
                f"the pipelined model was traced for batches of {expected_batch_size} (the example inputs) but got "
                f"{batch_size}; call prepare_pippy with an example of the batch size you run"
            )
        forward(*args, **kwargs)
    elif state.is_last_process:
        output = forward()
    else:
        forward()
    if gather_output:
        last = state.num_processes - 1
        # Only the last process knows the output's structure: tell the others whether it is a plain tensor.
        kind = broadcast_object_list([isinstance(output, torch.Tensor)], from_process=last)[0]
        if kind:
            output = copy_tensor_to_devices(output if state.is_last_process else None)
        else:
            output = broadcast_object_list([output], from_process=last)[0]
    return output


def prepare_pippy(
    model,
    split_points: Optional[Union[str, list[str]]] = "auto",
    no_split_module_classes: Optional[list[str]] = None,
    example_args: Optional[tuple[Any]] = (),
    example_kwargs: Optional[dict[str, Any]] = None,
    num_chunks: Optional[int] = None,
    gather_output: Optional[bool] = False,
):
    """Cut `model` into one pipeline stage per process for inference (see the module docstring).

    `example_args`/`example_kwargs` are one full batch; its size must split into `num_chunks` (default: the
    number of processes) micro-batches, and later calls must use batches of the same size."""
    _pipelining()
    state = PartialState()
    example_args = send_to_device(tuple(example_args or ()), "cpu")
    example_kwargs = send_to_device(example_kwargs, "cpu") if example_kwargs else None
    num_chunks = num_chunks or state.num_processes
    batch_size = find_pippy_batch_size(example_args, example_kwargs)
    if batch_size is None:
        raise ConfigError("prepare_pippy needs example_args or example_kwargs holding a batch of inputs")
    if batch_size % num_chunks:
        raise ConfigError(
            f"prepare_pippy: the example batch of {batch_size} does not split into num_chunks={num_chunks} "
            f"micro-batches; use a batch size that is a multiple of {num_chunks}"
        )
    if split_points == "auto":
        split_points = generate_split_points(model, state.num_processes, no_split_module_classes)
    elif isinstance(split_points, str):
        split_points = [split_points]
    split_points = list(split_points)
    model.hf_split_points = split_points
    schedule = None
    if state.num_processes > 1:
        schedule = build_pipeline(model, split_points, _first_chunk(example_args, batch_size, num_chunks),
                                  _first_chunk(example_kwargs, batch_size, num_chunks), num_chunks)
    model._original_forward = model.forward
    model._original_call = model.__call__
    model.pippy_stage = schedule
    step = schedule.step if schedule is not None else model._original_forward
    forward = functools.partial(pippy_forward, step, num_chunks, gather_output, expected_batch_size=batch_size)
    forward.__wrapped__ = model._original_forward  # so unwrapping finds the model's own forward
    model.forward = forward
    return model
