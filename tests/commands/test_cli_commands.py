"""`hasten to-fsdp2` and the Accelerate module paths of the CLI commands (`hasten tpu-config`: test_tpu.py)."""

from __future__ import annotations

import argparse
import importlib
import json

import pytest
import yaml

from hasten.commands import cli
from hasten.commands.to_fsdp2 import convert_config_to_fsdp2, to_fsdp2_command

FSDP1 = {
    "compute_environment": "LOCAL_MACHINE",
    "distributed_type": "FSDP",
    "num_processes": 2,
    "fsdp_config": {
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_backward_prefetch": "BACKWARD_PRE",
        "fsdp_forward_prefetch": False,
        "fsdp_cpu_ram_efficient_loading": True,
        "fsdp_offload_params": False,
        "fsdp_sharding_strategy": "SHARD_GRAD_OP",
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_sync_module_states": True,
        "fsdp_transformer_layer_cls_to_wrap": "GPT2Block",
        "fsdp_use_orig_params": True,
        "fsdp_activation_checkpointing": False,
    },
}


def write(path, config):
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_conversion_maps_the_strategy_and_drops_fsdp1_only_keys(caplog):
    converted = convert_config_to_fsdp2(json.loads(json.dumps(FSDP1)))
    assert converted["fsdp_config"] == {
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_cpu_ram_efficient_loading": True,
        "fsdp_offload_params": False,
        "fsdp_reshard_after_forward": False,
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_transformer_layer_cls_to_wrap": "GPT2Block",
        "fsdp_activation_checkpointing": False,
        "fsdp_version": 2,
    }
    assert converted["num_processes"] == 2 and converted["distributed_type"] == "FSDP"
    warnings = caplog.text  # logged, as Accelerate's command logs them
    for key in ("fsdp_backward_prefetch", "fsdp_forward_prefetch", "fsdp_sync_module_states", "fsdp_use_orig_params"):
        assert f"dropped {key}" in warnings


@pytest.mark.parametrize("strategy, reshard", [
    ("FULL_SHARD", True), ("HYBRID_SHARD", True), ("SHARD_GRAD_OP", False), ("HYBRID_SHARD_ZERO2", False),
    ("NO_SHARD", False), (1, True), (2, False),
])
def test_every_sharding_strategy_has_its_reshard_value(strategy, reshard):
    for key in ("fsdp_sharding_strategy", "fsdp_reshard_after_forward"):  # FSDP1 configs wrote either key
        converted = convert_config_to_fsdp2({"fsdp_config": {key: strategy}})
        assert converted["fsdp_config"] == {"fsdp_reshard_after_forward": reshard, "fsdp_version": 2}


def test_already_fsdp2_or_no_fsdp_block_is_left_alone(caplog):
    v2 = {"fsdp_config": {"fsdp_version": 2, "fsdp_reshard_after_forward": True}}
    assert convert_config_to_fsdp2(v2) == v2
    assert convert_config_to_fsdp2({"num_processes": 2}) == {"num_processes": 2}
    assert "Config already specifies FSDP2, skipping conversion..." in caplog.records[0].getMessage()
    assert "fsdp_version: 2" in caplog.records[0].getMessage()


def test_command_writes_a_file_hasten_launch_accepts(tmp_path):
    from hasten.config.file import load_config_file

    source = write(tmp_path / "fsdp1.yaml", FSDP1)
    assert cli.main(["to-fsdp2", "--config_file", source, "--output_file", str(tmp_path / "fsdp2.yaml")]) == 0
    written = yaml.safe_load((tmp_path / "fsdp2.yaml").read_text())
    assert written["fsdp_config"]["fsdp_version"] == 2
    assert yaml.safe_load((tmp_path / "fsdp1.yaml").read_text()) == FSDP1, "the input stays as it was"
    loaded = load_config_file(str(tmp_path / "fsdp2.yaml"))
    assert loaded["fsdp_config"]["fsdp_version"] == 2


def test_command_refuses_to_clobber_without_overwrite(tmp_path, capsys):
    source = write(tmp_path / "a.yaml", FSDP1)
    existing = tmp_path / "b.yaml"
    existing.write_text("keep: me\n")
    assert cli.main(["to-fsdp2", "--config_file", source, "--output_file", str(existing)]) == 1
    assert "Output file `" + str(existing) + "` already exists and --overwrite is not set" in capsys.readouterr().err
    assert existing.read_text() == "keep: me\n"
    assert cli.main(["to-fsdp2", "--config_file", source]) == 1
    assert "give --output_file PATH, or --overwrite" in capsys.readouterr().err
    assert cli.main(["to-fsdp2", "--config_file", str(tmp_path / "missing.yaml"), "--overwrite"]) == 1
    assert "not found" in capsys.readouterr().err
    # --overwrite without --output_file rewrites the input in place; a JSON file stays JSON
    json_file = tmp_path / "c.json"
    json_file.write_text(json.dumps(FSDP1))
    assert cli.main(["to-fsdp2", "--config-file", str(json_file), "--overwrite"]) == 0
    assert json.loads(json_file.read_text())["fsdp_config"]["fsdp_reshard_after_forward"] is False


def test_python_api_raises_accelerates_exception_types(tmp_path):
    args = argparse.Namespace(config_file=str(tmp_path / "none.yaml"), overwrite=True, output_file=None)
    with pytest.raises(FileNotFoundError):
        to_fsdp2_command(args)
    args.config_file = write(tmp_path / "a.yaml", FSDP1)
    args.overwrite, args.output_file = False, args.config_file
    with pytest.raises(FileExistsError):
        to_fsdp2_command(args)
    # the output's existence is asked through pathlib (Accelerate's tests patch Path.exists)
    from unittest import mock

    args.output_file = str(tmp_path / "not-there.yaml")
    with mock.patch("pathlib.Path.exists", return_value=True), pytest.raises(FileExistsError):
        to_fsdp2_command(args)


@pytest.mark.parametrize("module, names", [
    ("hasten.commands.to_fsdp2", ["to_fsdp2_command_parser", "to_fsdp2_command", "convert_config_to_fsdp2",
                                  "load_config"]),
    ("hasten.commands.tpu", ["tpu_command_parser", "tpu_command_launcher", "main"]),
    ("hasten.commands.merge", ["merge_command_parser", "merge_command", "main"]),
])
def test_accelerate_module_paths_and_subparsers(module, names):
    loaded = importlib.import_module(module)
    for name in names:
        assert callable(getattr(loaded, name)), f"{module}.{name}"
    parser_fn = next(getattr(loaded, n) for n in names if n.endswith("parser"))
    subparsers = argparse.ArgumentParser().add_subparsers()
    sub = parser_fn(subparsers=subparsers)
    assert callable(sub.get_default("func")), "registered as a subcommand, the parser carries its function"


def test_merge_command_reports_a_bad_folder(tmp_path, capsys):
    assert cli.main(["merge-weights", str(tmp_path / "nothing"), str(tmp_path / "out")]) == 1
    assert "hasten merge-weights:" in capsys.readouterr().err


# -- Accelerate's helper names in the command modules -------------------------------------------------------------

def test_env_command_returns_the_report_and_finds_commands_on_path(monkeypatch, capsys):
    from hasten.commands import env

    monkeypatch.setattr(env, "which", lambda name: None)  # Accelerate's tests patch this name
    info = env.env_command(env.env_command_parser().parse_args([]))
    assert info["`accelerate` bash location"] == "Not found" and info["`hasten` bash location"] == "Not found"
    monkeypatch.setattr(env, "which", lambda name: f"/bin/{name}")
    info = env.env_command(env.env_command_parser().parse_args(["--markdown"]))
    assert info["`hasten` bash location"] == "/bin/hasten"
    assert "- `accelerate` bash location: /bin/accelerate" in capsys.readouterr().out


def test_test_command_launches_the_self_check_with_the_config_file(monkeypatch, capsys):
    from hasten.commands import test as test_cmd

    calls = []
    monkeypatch.setattr(test_cmd.subprocess, "call", lambda command: calls.append(command) or 0)
    test_cmd.test_command(test_cmd.test_command_parser().parse_args(["--config_file", "c.yaml"]))
    assert "--config_file=c.yaml" in calls[0] and calls[0][-1] == "--self-check-worker"
    assert test_cmd.SUCCESS in capsys.readouterr().out
    monkeypatch.setattr(test_cmd.subprocess, "call", lambda command: 3)
    with pytest.raises(RuntimeError, match="exit code 3"):
        test_cmd.test_command(test_cmd.test_command_parser().parse_args([]))


def test_config_helpers_follow_the_settings_table():
    from hasten.commands.config import config, config_utils
    from hasten.config import settings

    assert "INDUCTOR" in config_utils.DYNAMO_BACKENDS and "NO" not in config_utils.DYNAMO_BACKENDS
    assert len(config_utils.DYNAMO_BACKENDS) == len(settings.get("dynamo_backend").choices) - 1
    parser = argparse.ArgumentParser(prog="hasten <command> [<args>]",
                                     formatter_class=config_utils.SubcommandHelpFormatter)
    assert "<command> [<args>]" not in parser.format_usage()
    assert callable(config.main)


def test_to_fsdp2_mappings_are_the_conversion_it_runs():
    from hasten.commands.merge import description
    from hasten.commands.to_fsdp2 import ARGUMENT_KEY_MAPPING, ARGUMENT_VALUE_MAPPING, ConversionStatus

    assert ARGUMENT_KEY_MAPPING["fsdp_sharding_strategy"] == "fsdp_reshard_after_forward"
    assert ARGUMENT_KEY_MAPPING["fsdp_use_orig_params"] is ConversionStatus.REMOVED
    assert ARGUMENT_KEY_MAPPING["fsdp_forward_prefetch"] is ConversionStatus.NOT_YET_IMPLEMENTED
    dropped = [key for key, target in ARGUMENT_KEY_MAPPING.items() if isinstance(target, ConversionStatus)]
    converted = convert_config_to_fsdp2({"fsdp_config": {key: True for key in dropped}})
    assert converted["fsdp_config"] == {"fsdp_version": 2}
    assert ARGUMENT_VALUE_MAPPING["fsdp_sharding_strategy"]["SHARD_GRAD_OP"] is False
    assert "SHARDED_STATE_DICT" in description
