"""hasten.launch.prepare's SageMaker helper: a script's `--name value` arguments as typed hyperparameters."""

from __future__ import annotations

import os

import pytest

from hasten.utils.launch import _convert_nargs_to_dict


def test_script_arguments_become_typed_hyperparameters():
    converted = _convert_nargs_to_dict(["--model-name", "bert", "--do_train", "False", "--epochs", "3",
                                        "--lr", "5e-5", "--max_steps", "50.5", "--shift", "-2", "--whole", "4.0"])
    assert converted == {"model_name": "bert", "do_train": False, "epochs": 3, "lr": 5e-5, "max_steps": 50.5,
                         "shift": -2, "whole": 4}
    assert type(converted["epochs"]) is int and type(converted["whole"]) is int
    assert _convert_nargs_to_dict([]) == {}


@pytest.mark.parametrize("nargs", [["--do_train", "--epochs", "3"], ["--epochs", "3", "--do_predict"]])
def test_a_switch_without_a_value_is_refused_with_accelerates_words(nargs):
    with pytest.raises(ValueError, match="SageMaker doesn’t support argparse actions for `store_true`"):
        _convert_nargs_to_dict(nargs)


def test_a_value_without_a_name_is_refused():
    with pytest.raises(ValueError, match="'stray' follows no --name"):
        _convert_nargs_to_dict(["stray", "--epochs", "3"])


# -- `_validate_launch_command`: the parsed command line completed as the launch resolves it --------------------

def test_validate_launch_command_fills_what_the_command_line_left_out(tmp_path, monkeypatch):
    from hasten.commands.launch import _validate_launch_command, launch_command_parser

    for name in [n for n in os.environ if n.startswith(("HASTEN_", "ACCELERATE_", "FSDP_"))]:
        monkeypatch.delenv(name)
    config = tmp_path / "config.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndebug: true\nnum_processes: 1\ndistributed_type: 'NO'\n"
                      "mixed_precision: bf16\nfsdp_config:\n  fsdp_sync_module_states: false\n")
    args = launch_command_parser().parse_args(["--num-processes", "2", "--config-file", str(config), "train.py"])
    assert not args.debug and args.mixed_precision is None
    args, loaded, mp_from_config = _validate_launch_command(args)
    assert args.debug is True and args.num_processes == 2  # the file fills, the flag keeps its value
    assert args.mixed_precision == "bf16" and mp_from_config is True
    assert loaded.debug is True and loaded.mixed_precision == "bf16"

    args, loaded, mp_from_config = _validate_launch_command(
        launch_command_parser().parse_args(["--config_file", str(config), "--mixed_precision", "no", "train.py"]))
    assert args.mixed_precision == "no" and mp_from_config is False


def test_validate_launch_command_without_a_file_uses_the_defaults(tmp_path, monkeypatch):
    from hasten.commands.launch import _validate_launch_command, launch_command_parser

    monkeypatch.setenv("HF_HOME", str(tmp_path))  # no default config file there
    args, loaded, mp_from_config = _validate_launch_command(launch_command_parser().parse_args(["--cpu", "t.py"]))
    assert loaded is None and mp_from_config is False
    assert args.num_processes == 1 and args.debug is False


def test_cpu_launch_exports_intel_openmp_pinning_unless_the_user_set_it(monkeypatch):
    from hasten.commands.launch import launch_command_parser
    from hasten.utils.launch import prepare_simple_launcher_cmd_env

    monkeypatch.delenv("KMP_AFFINITY", raising=False)
    monkeypatch.delenv("KMP_BLOCKTIME", raising=False)
    parser = launch_command_parser()
    _, env = prepare_simple_launcher_cmd_env(parser.parse_args(["--cpu", "t.py"]))
    assert env["KMP_AFFINITY"] == "granularity=fine,compact,1,0" and env["KMP_BLOCKTIME"] == "1"
    _, env = prepare_simple_launcher_cmd_env(parser.parse_args(["t.py"]))
    assert "KMP_AFFINITY" not in env and "KMP_BLOCKTIME" not in env
    monkeypatch.setenv("KMP_BLOCKTIME", "0")
    _, env = prepare_simple_launcher_cmd_env(parser.parse_args(["--cpu", "t.py"]))
    assert env["KMP_BLOCKTIME"] == "0"


def test_setup_fp8_env_writes_the_variables_the_processes_read():
    from hasten.commands.launch import launch_command_parser
    from hasten.utils.launch import setup_fp8_env

    args = launch_command_parser().parse_args(["--mixed_precision", "fp8", "--fp8_backend", "te", "--fp8_margin",
                                               "1", "t.py"])
    args.fp8_override_linear_precision = (True, False, True)
    env = setup_fp8_env(args, {"KEEP": "1"})
    assert env["KEEP"] == "1" and env["HASTEN_FP8_BACKEND"].lower() == "te" and env["HASTEN_FP8_MARGIN"] == "1"
    assert (env["HASTEN_FP8_OVERRIDE_FPROP"], env["HASTEN_FP8_OVERRIDE_DGRAD"], env["HASTEN_FP8_OVERRIDE_WGRAD"]) == (
        "true", "false", "true")
    assert "HASTEN_FP8_FORMAT" not in env  # not typed: nothing written


def test_prepare_extend_env_parallelism_config():
    from hasten.commands.launch import launch_command_parser
    from hasten.utils.launch import prepare_extend_env_parallelism_config

    parser = launch_command_parser()
    args = parser.parse_args(["--parallelism_config_dp_shard_size", "2", "--parallelism_config_tp_size", "2", "t.py"])
    env = prepare_extend_env_parallelism_config(args, {})
    assert env["HASTEN_USE_PARALLELISM_CONFIG"] == "true"
    assert env["PARALLELISM_CONFIG_DP_SHARD_SIZE"] == "2" and env["PARALLELISM_CONFIG_TP_SIZE"] == "2"
    args = parser.parse_args(["--parallelism_config_sp_size", "2", "t.py"])  # built (issue 33): exported
    assert prepare_extend_env_parallelism_config(args, {})["PARALLELISM_CONFIG_SP_SIZE"] == "2"


def test_an_untyped_switch_reads_false_and_the_file_still_applies(tmp_path, monkeypatch):
    from hasten.commands.launch import launch_command_parser
    from hasten.config.launch_settings import resolve_launch

    for name in [n for n in os.environ if n.startswith(("HASTEN_", "ACCELERATE_"))]:
        monkeypatch.delenv(name)
    args = launch_command_parser().parse_args(["t.py"])
    assert args.multi_gpu is False and args.use_fsdp is False and args.cpu is False  # as Accelerate's parser
    config = tmp_path / "c.yaml"
    config.write_text("distributed_type: MULTI_CPU\nnum_processes: 2\nuse_cpu: true\ndebug: true\n")
    settings = resolve_launch(launch_command_parser().parse_args(["--config_file", str(config), "t.py"]))
    assert settings["use_cpu"] is True and settings["debug"] is True and settings["num_processes"] == 2
    assert settings.values["use_cpu"].source == "file"
