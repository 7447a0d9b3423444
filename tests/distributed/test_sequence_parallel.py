"""Ulysses sequence parallelism: hasten's on the mesh (sp_backend "hasten", with DDP and FSDP2) and Accelerate's
`sp_size` with DeepSpeed (sp_backend "deepspeed"). The trainings run in real processes through hasten's launcher
(tests/workers/sp_*.py); the rest checks the pieces in this process."""

from __future__ import annotations

import json

import pytest
import torch
from launching import launch

from hasten import Accelerator, ParallelismConfig
from hasten.core.errors import ConfigError, NotBuiltError
from hasten.data.sequence_shard import shard_sequence_batch

TOL = 1e-5


def _one_line(error) -> str:
    text = str(error.value)
    assert "\n" not in text, text
    return text


# -- the batch cut ----------------------------------------------------------------------------------------------
def test_a_batch_is_padded_to_a_multiple_of_sp_and_each_rank_keeps_its_slice():
    ids = torch.tensor([[5, 6, 7, 8, 9], [1, 2, 3, 0, 0]])
    batch = {"input_ids": ids, "labels": torch.where(ids > 0, ids, -100), "attention_mask": (ids > 0).long(),
             "extra": "kept"}
    first, second = (shard_sequence_batch(batch, rank, 2) for rank in (0, 1))
    assert first["input_ids"].tolist() == [[5, 6, 7], [1, 2, 3]]
    assert second["input_ids"].tolist() == [[8, 9, 0], [0, 0, 0]]  # padded on the right to 6
    assert first["position_ids"].tolist() == [[0, 1, 2]] * 2 and second["position_ids"].tolist() == [[3, 4, 5]] * 2
    # the next-token targets of the whole sequence: the last token of rank 0's slice predicts the first of rank 1's
    assert first["shift_labels"].tolist() == [[6, 7, 8], [2, 3, -100]]
    assert second["shift_labels"].tolist() == [[9, -100, -100], [-100, -100, -100]]
    assert second["attention_mask"].tolist() == [[1, 1, 0], [0, 0, 0]] and first["extra"] == "kept"


def test_a_batch_the_cut_cannot_take_is_one_line():
    with pytest.raises(ConfigError) as error:
        shard_sequence_batch(torch.ones(2, 4), 0, 2)
    assert "dict batches" in _one_line(error)
    left_padded = {"input_ids": torch.ones(1, 4, dtype=torch.long), "attention_mask": torch.tensor([[0, 1, 1, 1]])}
    with pytest.raises(ConfigError) as error:
        shard_sequence_batch(left_padded, 0, 2)
    assert "right padding" in _one_line(error) and "padding_side = 'right'" in _one_line(error)
    with pytest.raises(ConfigError) as error:
        shard_sequence_batch({"labels": torch.ones(1, 4)}, 0, 2)
    assert "needs input_ids" in _one_line(error)


# -- the layouts --------------------------------------------------------------------------------------------------
def test_hastens_sp_builds_an_sp_mesh_dimension_and_accelerates_config_does_not():
    native = ParallelismConfig(sp_size=2, sp_backend="hasten", dp_shard_size=2)
    assert native.native_sp_enabled and native._get_mesh() == (("dp_shard", "sp"), (2, 2))
    assert native.dp_shard_cp_dim_names == ["dp_shard", "sp"]  # FSDP2 shards over the sp ranks too
    deepspeed = ParallelismConfig(sp_size=2)  # Accelerate's default backend: DeepSpeed's own groups
    assert deepspeed.sp_backend == "deepspeed" and not deepspeed.native_sp_enabled
    assert deepspeed.build_device_mesh("cpu") is None and deepspeed.dp_shard_cp_dim_names == []
    assert type(deepspeed.sp_handler).__name__ == "DeepSpeedSequenceParallelConfig"


@pytest.mark.parametrize("kwargs, error_type, expected", [
    (dict(sp_size=2, sp_backend="ring"), ConfigError, "sp_backend must be one of ['deepspeed'], but got ring"),
    (dict(sp_size=2, cp_size=2), ConfigError,
     "Context Parallelism (CP) and Sequence Parallelism (SP) are mutually exclusive."),
])
def test_accelerates_errors_come_in_its_words(kwargs, error_type, expected):
    with pytest.raises(error_type) as error:
        ParallelismConfig(**kwargs)
    assert _one_line(error).startswith(expected)
    assert issubclass(error_type, ValueError)  # Accelerate raises ValueError


@pytest.mark.parametrize("sizes, deepspeed, error_type, expected", [
    (dict(tp_size=2), False, NotBuiltError, "tp_size=2: hasten's Ulysses composes with dp_replicate and dp_shard"),
    (dict(pp_size=2), False, NotBuiltError, "pp_size=2"),
    ({}, True, ConfigError, "In order to use the configured sp_size=2 with DeepSpeed, you need to configure "
                            "sp_backend='deepspeed'"),
])
def test_layouts_hastens_sp_does_not_run_are_one_line(sizes, deepspeed, error_type, expected):
    from hasten.plan.layout import backend_for_layout

    config = ParallelismConfig(sp_size=2, sp_backend="hasten", **sizes)
    with pytest.raises(error_type) as error:
        backend_for_layout(config, config.total_size, deepspeed=deepspeed)
    assert expected in _one_line(error)


def test_sp_on_the_launchers_flags_reaches_the_processes():
    from hasten.commands.launch import launch_command_parser
    from hasten.utils.launch import prepare_extend_env_parallelism_config

    args = launch_command_parser().parse_args(["--parallelism_config_sp_size", "2", "--parallelism_config_sp_backend",
                                               "hasten", "t.py"])
    env = prepare_extend_env_parallelism_config(args, {})
    assert env["PARALLELISM_CONFIG_SP_SIZE"] == "2" and env["PARALLELISM_CONFIG_SP_BACKEND"] == "hasten"
    with pytest.raises(SystemExit):  # argparse's choices: one line on stderr
        launch_command_parser().parse_args(["--parallelism_config_sp_backend", "ring", "t.py"])
    from hasten.commands.launch import plan_launch

    def plan(*flags):
        return plan_launch(launch_command_parser().parse_args(["--cpu", *flags, "t.py"]))

    # hasten's sp counts in the number of processes; DeepSpeed's spans them its own way (Accelerate skips the check)
    hasten_sp = ("--parallelism_config_sp_size", "2", "--parallelism_config_sp_backend", "hasten")
    assert plan(*hasten_sp).num_processes == 2
    assert plan(*hasten_sp, "--parallelism_config_dp_shard_size", "2").num_processes == 4
    with pytest.raises(ConfigError, match="multiply to 2 but num_processes is 4"):
        plan("--num_processes", "4", *hasten_sp)
    assert plan("--num_processes", "4", "--parallelism_config_sp_size", "2").num_processes == 4


def test_sp_from_the_environment_alone_builds_the_config(monkeypatch):
    from hasten.plan.layout import config_for_run

    monkeypatch.setenv("PARALLELISM_CONFIG_SP_SIZE", "2")
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_BACKEND", "hasten")
    config = config_for_run(None)
    assert config is not None and config.sp_size == 2 and config.native_sp_enabled


def test_deepspeed_ulysses_is_handed_the_handlers_fields(monkeypatch):
    """DeepSpeedSequenceParallelConfig's fields reach DeepSpeed's registration as Accelerate hands them (the CPU part:
    a fixed sequence length shapes DeepSpeed's buffers on an accelerator, the run itself is tests/workers/sp_deepspeed.py)."""
    pytest.importorskip("deepspeed")
    from types import SimpleNamespace

    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    from hasten.backends.deepspeed import ulysses
    from hasten.utils.dataclasses import DeepSpeedSequenceParallelConfig

    for name in ("SP_SEQ_LENGTH", "SP_SEQ_LENGTH_IS_VARIABLE", "SP_ATTN_IMPLEMENTATION"):
        monkeypatch.delenv(f"PARALLELISM_CONFIG_{name}", raising=False)
    seen = {}
    monkeypatch.setattr(UlyssesSPAttentionHF, "register_with_transformers",
                        staticmethod(lambda **kwargs: seen.update(kwargs) or "mpu"))
    handler = DeepSpeedSequenceParallelConfig(sp_seq_length=64, sp_seq_length_is_variable=False,
                                              sp_attn_implementation="sdpa")
    config = ParallelismConfig(sp_backend="deepspeed", sp_size=2, sp_handler=handler)
    model = torch.nn.Linear(2, 2)
    model.config = SimpleNamespace()  # transformers' models carry one; registration asks for it
    assert ulysses.register(config, model, micro_batch_size=3) == "mpu"
    handed = {key: seen[key] for key in ("sequence_parallel_size", "seq_length", "seq_length_is_variable",
                                         "core_attn_implementation", "micro_batch_size")}
    assert handed == {"sequence_parallel_size": 2, "seq_length": 64, "seq_length_is_variable": False,
                      "core_attn_implementation": "sdpa", "micro_batch_size": 3}


def test_the_dl_adapter_is_deepspeeds_and_a_no_op_without_sp():
    accelerator = Accelerator(cpu=True)
    loader = torch.utils.data.DataLoader(range(4))
    assert accelerator.deepspeed_ulysses_dl_adapter(loader, torch.nn.Linear(1, 1)) is loader


# -- in real processes ----------------------------------------------------------------------------------------------
def test_sp2_equals_one_process_pads_and_resumes(tmp_path):
    """sp 2 from a config file's block (DDP over the two sp ranks): 5 steps of a tiny Llama equal one process on whole
    sequences, with fixed and variable lengths (padded to a multiple of 2); save -> load continues identically; key/value
    heads that do not divide by sp are one line (tests/workers/sp_train.py)."""
    config = tmp_path / "config.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nnum_processes: 2\n"
                      "parallelism_config:\n  parallelism_config_sp_size: 2\n  parallelism_config_sp_backend: hasten\n")
    launch("sp_train.py", tmp_path, flags=("--config_file", str(config)), timeout=600)
    result = json.loads((tmp_path / "result.json").read_text())
    for name in ("fixed", "variable"):
        assert result[name]["loss"] <= TOL and result[name]["weights"] <= TOL, result
    assert result["resume"] == {"loss": 0.0, "weights": 0.0}, result
    assert "2" in result["heads_error"] and "key/value heads do not divide by sp_size=2" in result["heads_error"]


def test_a_model_whose_attention_hasten_cannot_hook_is_refused_and_ulysses_attention_makes_it_right():
    """sp 2 with a plain nn.Module (no transformers config): its first forward is refused in one line, since its
    attention saw only each rank's slice (it trained silently wrong: the loss was off by 3.6e-2); with its attention
    function wrapped in ulysses_attention it trains to one process's loss and weights on whole sequences
    (tests/workers/sp_plain_module.py)."""
    result = launch("sp_plain_module.py", timeout=600)
    for check in ("refused", "wrapped"):
        assert result.stdout.count(f"ok {check} rank") == 2, result.stdout[-3000:] + result.stderr[-3000:]


def test_sp_with_ddp_and_fsdp2_on_four_processes(tmp_path):
    """dp_replicate 2 x sp 2 (DDP) and dp_shard 2 x sp 2 (FSDP2) equal one process; token-normalised accumulation
    over sp ranks equals one process on the window's tokens (tests/workers/sp_layouts.py)."""
    launch("sp_layouts.py", tmp_path, num_processes=4, timeout=600)
    result = json.loads((tmp_path / "result.json").read_text())
    for name in ("ddp", "fsdp2", "tokens"):
        assert all(value <= TOL for value in result[name].values()), result
    assert set(result["ddp"]) == {"loss", "weights"} and set(result["fsdp2"]) == {"loss", "weights"}


@pytest.mark.parametrize("stage", [2, 3])
def test_accelerates_sp_size_with_deepspeed_equals_one_process(tmp_path, stage):
    """Accelerate's sp_size under DeepSpeed ZeRO-2/3 on gloo: DeepSpeed's Ulysses with its mpu handed to the engine,
    prepared loaders adapted (each sp rank gets half of the same batch, the loader twice as long), the batch size
    counted with sp folded out; 4 steps of Accelerate's own recipe equal one process; a loader prepared apart is
    adapted by deepspeed_ulysses_dl_adapter (tests/workers/sp_deepspeed.py)."""
    pytest.importorskip("deepspeed")
    launch("sp_deepspeed.py", tmp_path, stage, timeout=600)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["loss"] <= TOL and result["weights"] <= TOL, result
    assert result["train_batch_size"] == 1 and result["loader_length"] == 8, result  # micro 1 x 2 processes / sp 2
    assert result["adapter"] == {"length": 8, "seq": 6, "keys": ["input_ids", "position_ids", "shift_labels"]}


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeeds_sp_with_sequences_of_different_lengths_on_the_ranks_runs_on_gloo(tmp_path, stage):
    """Accelerate's sp_size under DeepSpeed ZeRO-2/3 with 16 and 12 tokens on the two ranks (the data of Accelerate's
    sp-alst.py): DeepSpeed's loader adapter all-gathers the ranks' batches, which gloo refuses for uneven tensors (it
    crashed); the prepared loaders pad them on the right to the longest, and 4 steps of Accelerate's recipe equal one
    process on whole sequences (tests/workers/sp_deepspeed_lengths.py)."""
    pytest.importorskip("deepspeed")
    launch("sp_deepspeed_lengths.py", tmp_path, stage, 1.0, timeout=600)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["loss"] <= TOL and result["weights"] <= TOL, result


@pytest.mark.parametrize("stage", [2, 3])
def test_true_gradient_loss_gives_one_process_gradient_at_every_zero_stage(tmp_path, stage):
    """Without clipping (which hides a factor), Accelerate's sp recipe under DeepSpeed gives sp_size times the
    gradient at ZeRO-2 and the true one at ZeRO-3 (measured: ZeRO-2's loss off by 0.12 after 4 SGD steps, ZeRO-3's
    within 5e-7); its loss through hasten's true_gradient_loss(loss, model) equals one process on whole sequences
    at both stages (tests/workers/sp_deepspeed_lengths.py)."""
    pytest.importorskip("deepspeed")
    launch("sp_deepspeed_lengths.py", tmp_path, stage, 0, "helper", timeout=600)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["loss"] <= TOL and result["weights"] <= TOL, result


# -- the rest of Accelerate's parallel surface (issue 33 item 3) ------------------------------------------------------
def test_clip_grad_value_under_tensor_parallelism_alone():
    """Accelerate clips by value under TP without FSDP; so does hasten now (tests/workers/tp_clip_value.py: tp 2 with
    a clamp at 0.01 equals one process, which without the clamp ends elsewhere)."""
    result = launch("tp_clip_value.py", timeout=600)
    assert "tp clip_grad_value ok" in result.stdout


def test_clip_grad_value_with_fsdp2_composed_stays_refused():
    from hasten.backends.tensor_parallel import TensorParallelBackend

    backend = TensorParallelBackend.__new__(TensorParallelBackend)
    backend._device_mesh = lambda: object()  # FSDP2 over data dimensions: Accelerate refuses (distributed type FSDP)
    assert backend.supports_clip_grad_value is False
    backend._device_mesh = lambda: None
    assert backend.supports_clip_grad_value is True


def test_load_checkpoint_in_model_broadcast_from_rank0_fills_an_fsdp2_model(tmp_path):
    """Only rank 0 reads the file; each rank of dp_shard 2 gets its shards (tests/workers/load_broadcast.py)."""
    result = launch("load_broadcast.py", tmp_path, timeout=600)
    assert result.stdout.count("broadcast load ok") == 2, result.stdout
