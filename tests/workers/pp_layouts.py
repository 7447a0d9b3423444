"""Pipeline parallelism in real processes: several layouts in one launch, each 5 SGD steps compared with one
process training the same global batches. Usage: pp_layouts.py <folder> <layout>...
layouts: gpipe, 1f1b (pp=2 on 2 processes), interleaved, zbv (2 stages per process), pp_dp, pp_fsdp, pp_tp
(4 processes); `resume`: pp=2 resumes pp_resume_one.py's one-process checkpoint; `ckpt` also saves after step 3 of the 1F1B run, for pp_resume_one.py."""

import os
import sys

import torch.distributed as dist

from pp_common import fresh_accelerator, make_model, max_diff, reference, sgd, tokens
from hasten.parallelism_config import ParallelismConfig, TorchPipelineParallelConfig

TOL = 1e-5
folder, layouts = sys.argv[1], sys.argv[2:]
want, want_losses = reference(range(5))
SIZES = {"gpipe": {}, "1f1b": {}, "interleaved": {}, "zbv": {}, "pp_dp": {"dp_replicate_size": 2},
         "pp_fsdp": {"dp_shard_size": 2}, "pp_tp": {"tp_size": 2}, "resume": {}}
SCHEDULE = {"gpipe": "GPipe", "interleaved": "Interleaved1F1B", "zbv": "ZBVZeroBubble"}


def run(layout):
    handler = TorchPipelineParallelConfig(schedule=SCHEDULE.get(layout, "1F1B"))
    acc = fresh_accelerator(parallelism_config=ParallelismConfig(pp_size=2, pp_handler=handler, **SIZES[layout]))
    model = make_model(seed=1)  # other weights than the reference's: the reference's are loaded below on rank 0's copy
    model.load_state_dict(make_model().state_dict())
    opt = sgd(model.parameters())
    model, opt = acc.prepare(model, opt)
    data_size = acc.parallelism_config.data_parallel_size
    dp_rank = (acc.data_parallel_rank if acc.parallelism_config.dp_replicate_enabled else acc.data_parallel_shard_rank)
    losses, first = [None] * 3, 0
    if layout == "resume":  # the one-process checkpoint of pp_resume_one.py, read by two stages
        acc.load_state(os.path.join(folder, "one_ckpt"))
        first = 3
    else:
        losses = []
    for step in range(first, 5):
        batch = tokens(step)
        local = batch.chunk(data_size)[dp_rank]
        with acc.accumulate(model):
            loss = model(local[:, :-1], labels=local[:, 1:])
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
        losses.append(acc.reduce(loss, "mean").item() if data_size > 1 else loss.item())
        if layout == "1f1b" and step == 2 and "ckpt" in layouts:
            acc.save_state(os.path.join(folder, "pp_ckpt"))
    for got, expected in zip(losses, want_losses):
        assert got is None or abs(got - expected) < TOL, (layout, losses, want_losses)
    full = acc.get_state_dict(model)
    if acc.is_main_process:
        diff = max_diff(full, want)
        assert diff < TOL, (layout, diff)
    if layout == "1f1b":
        acc.save_model(model, os.path.join(folder, "pp_saved"))
        if acc.is_main_process:
            from safetensors.torch import load_file

            saved = load_file(os.path.join(folder, "pp_saved", "model.safetensors"))
            assert max_diff(saved, want) < TOL
    acc.print(f"pp layout {layout}: 5 steps equal one process (stages {model.stage_ids}, "
              f"{model.schedule_name}, {model.num_microbatches} micro-batches)")
    acc.wait_for_everyone()


for layout in layouts:
    if layout != "ckpt":
        run(layout)
dist.barrier()
