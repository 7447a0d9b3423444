"""Pipeline parallelism: stage splitting and the refusals in this process; training (GPipe, 1F1B, interleaved
1F1B, ZBV zero bubble), pp x DDP / FSDP2 / TP and checkpoints across pipeline layouts in real processes
(tests/workers/pp_layouts.py, pp_resume_one.py)."""

from __future__ import annotations

import subprocess
import sys
from collections import OrderedDict

import pytest
import torch

from hasten.core.errors import ConfigError, PipelineSplitError
from hasten.distributed.pipeline import balanced_split, pipeline_blocks, prune, stage_blocks, stages_of_rank
from hasten.parallelism_config import ParallelismConfig, TorchPipelineParallelConfig
from launching import SCRIPTS, launch


def _one_line(error) -> str:
    text = str(error.value)
    assert "\n" not in text, text
    return text


def _model(depth=4, width=8):
    return torch.nn.Sequential(OrderedDict(
        embed=torch.nn.Embedding(10, width),
        blocks=torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(depth))),
        head=torch.nn.Linear(width, 10),
    ))


def test_blocks_are_the_leaves_of_nested_sequentials_under_their_whole_model_names():
    names = [name for name, _ in pipeline_blocks(_model())]
    assert names == ["embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "head"]


def test_a_stage_keeps_the_whole_model_names_and_runs_its_blocks_in_order():
    model = _model()
    stage = prune(model, {"blocks.2", "blocks.3", "head"})
    assert list(stage.state_dict()) == ["blocks.2.weight", "blocks.2.bias", "blocks.3.weight", "blocks.3.bias",
                                        "head.weight", "head.bias"]
    x = torch.randn(3, 8)
    assert torch.equal(stage(x), model.head(model.blocks[3](model.blocks[2](x))))
    assert stage.head is model.head  # shared, not copied


def test_the_automatic_split_balances_parameter_counts():
    assert balanced_split([1, 1, 1, 1], 2) == [2]
    assert balanced_split([10, 1, 1, 1, 1, 10], 2) == [3]
    assert balanced_split([5, 1, 1, 1, 1, 1, 1, 1, 1, 5], 3) == [2, 8]  # 6, 6, 6
    stages = stage_blocks(_model(), 2)
    assert stages == [["embed", "blocks.0", "blocks.1"], ["blocks.2", "blocks.3", "head"]]


def test_a_user_split_list_by_name_or_index():
    assert stage_blocks(_model(), 2, ["blocks.1"])[1][0] == "blocks.1"
    assert stage_blocks(_model(), 3, [1, 4]) == [["embed"], ["blocks.0", "blocks.1", "blocks.2"], ["blocks.3", "head"]]


def test_stage_placement_loop_and_v():
    assert stages_of_rank(1, 2, 1, "1F1B") == [1]
    assert stages_of_rank(1, 4, 2, "Interleaved1F1B") == [1, 5]
    assert stages_of_rank(1, 4, 2, "ZBVZeroBubble") == [1, 6]


@pytest.mark.parametrize("model, split, stages, expected", [
    (torch.nn.Linear(2, 2), None, 2, "Linear has its own forward that hasten cannot cut"),
    (_model(depth=1), None, 4, "the model has 3 blocks, fewer than the 4 pipeline stages"),
    (_model(), ["blocks.9"], 2, "pipeline split point 'blocks.9' is not a block of the model"),
    (_model(), ["blocks.2", "blocks.1"], 3, "must be 2 increasing blocks after the first"),
])
def test_models_and_split_lists_that_cannot_be_cut_are_refused_in_one_line(model, split, stages, expected):
    with pytest.raises(PipelineSplitError) as error:
        stage_blocks(model, stages, split)
    assert expected in _one_line(error)


def test_the_pipeline_config_checks_its_fields():
    assert TorchPipelineParallelConfig(schedule="gpipe").schedule == "GPipe"
    assert TorchPipelineParallelConfig().schedule == "1F1B" and TorchPipelineParallelConfig().stages_per_rank == 1
    assert TorchPipelineParallelConfig(schedule="Interleaved1F1B").stages_per_rank == 2
    for kwargs, expected in (({"schedule": "Bogus"}, "is not one of 1F1B, GPipe"),
                             ({"microbatches": 0}, "microbatches=0 must be a whole number"),
                             ({"schedule": "GPipe", "stages_per_rank": 2}, "runs one stage per process"),
                             ({"loss_fn": 3}, "loss_fn must be callable")):
        with pytest.raises(ConfigError) as error:
            TorchPipelineParallelConfig(**kwargs)
        assert expected in _one_line(error)


def test_pp_size_is_a_mesh_dimension_outermost():
    config = ParallelismConfig(pp_size=2, dp_shard_size=2)
    assert config.total_size == 4 and config.pp_enabled and isinstance(config.pp_handler, TorchPipelineParallelConfig)
    assert config._get_mesh() == (("pp", "dp_shard"), (2, 2))
    assert ParallelismConfig(pp_size=2, dp_replicate_size=2)._get_mesh() == (("pp", "dp_replicate", "dp_shard"),
                                                                              (2, 2, 1))
    assert "pp" in config.non_dp_dim_names and config.data_parallel_size == 2


def test_pp_size_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("PARALLELISM_CONFIG_PP_SIZE", "2")
    monkeypatch.setenv("PARALLELISM_CONFIG_PP_SCHEDULE", "GPipe")
    config = ParallelismConfig()
    assert config.pp_size == 2 and config.pp_handler.schedule == "GPipe"


def test_a_v_schedule_that_cannot_start_over_gloo_is_refused_in_one_line(monkeypatch, one_process_group):
    """torch 2.11 starts a V schedule's stages with a send from the middle stages' process to itself: gloo
    fails on every rank with "Pair is not connected". Without torch's warm-up vote (2.13 has it) that is refused
    at prepare; loop schedules, and V schedules on a torch that has the vote, go ahead."""
    from hasten.distributed import pipeline
    from hasten.distributed.pipeline import refuse_unstartable_schedule

    monkeypatch.setattr(pipeline, "schedules_warm_up_by_vote", lambda: True)
    refuse_unstartable_schedule("ZBVZeroBubble", one_process_group)
    monkeypatch.setattr(pipeline, "schedules_warm_up_by_vote", lambda: False)
    for schedule in ("ZBVZeroBubble", "DualPipeV"):
        with pytest.raises(PipelineSplitError, match=rf"'{schedule}' cannot start over gloo on torch .*itself.*"
                                                     r"fix: 'Interleaved1F1B'"):
            refuse_unstartable_schedule(schedule, one_process_group)
    refuse_unstartable_schedule("Interleaved1F1B", one_process_group)


def test_pp_two_processes_schedules_and_checkpoints_across_layouts(tmp_path):
    """pp=2: GPipe, 1F1B, interleaved 1F1B and ZBV zero bubble each equal one process over 5 steps (1e-5); the
    1F1B run saves after 3 steps, one process resumes it identically, and pp=2 resumes one process's checkpoint."""
    from hasten.distributed.pipeline import schedules_warm_up_by_vote

    # ZBV over gloo needs torch's warm-up vote (2.13; refused before it, tested above)
    layouts = ["gpipe", "1f1b", "interleaved", *(["zbv"] if schedules_warm_up_by_vote() else [])]
    result = launch("pp_layouts.py", tmp_path, *layouts, "ckpt", timeout=300)
    for layout in layouts:
        assert f"pp layout {layout}: 5 steps equal one process" in result.stdout
    one = subprocess.run([sys.executable, str(SCRIPTS / "pp_resume_one.py"), str(tmp_path), "back"],
                         capture_output=True, text=True, timeout=180, cwd=SCRIPTS)
    assert one.returncode == 0, one.stderr[-3000:]
    assert "one process resumed the pp=2 checkpoint" in one.stdout
    back = launch("pp_layouts.py", tmp_path, "resume", timeout=180)
    assert "pp layout resume: 5 steps equal one process" in back.stdout


def test_pp_with_ddp_fsdp2_and_tp_on_four_processes(tmp_path):
    """pp=2 x dp_replicate=2 (replicas), pp=2 x dp_shard=2 (FSDP2), pp=2 x tp=2: each equals one process over 5
    steps (1e-5)."""
    result = launch("pp_layouts.py", tmp_path, "pp_dp", "pp_fsdp", "pp_tp", num_processes=4, timeout=300)
    for layout in ("pp_dp", "pp_fsdp", "pp_tp"):
        assert f"pp layout {layout}: 5 steps equal one process" in result.stdout
