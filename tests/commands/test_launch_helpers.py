"""Accelerate's helper names in `commands.launch`: the help formatter, option cleaning, and the launchers
(which start processes exactly as `hasten launch` does)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hasten.commands.launch import (
    CustomHelpFormatter,
    clean_option,
    deepspeed_launcher,
    launch_command_parser,
    multi_gpu_launcher,
    options_to_group,
    simple_launcher,
)
from hasten.core.errors import LaunchError


@pytest.fixture(autouse=True)
def _no_run_variables(monkeypatch):
    """No run variables in, and none left behind (a launch exports its settings into this process)."""
    import os

    saved = dict(os.environ)
    for name in [n for n in os.environ if n.startswith(("HASTEN_", "ACCELERATE_"))]:
        monkeypatch.delenv(name)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_clean_option():
    assert clean_option("--num-processes") == "num_processes" and clean_option("--use_fsdp") == "use_fsdp"
    assert clean_option("--fp8_backend") == "fp8_backend" and clean_option("-m") is None


def test_help_lists_one_spelling_per_flag_and_only_the_typed_paradigms_groups(monkeypatch):
    parser = launch_command_parser()
    assert parser.formatter_class is CustomHelpFormatter
    monkeypatch.setattr(sys, "argv", ["hasten", "launch", "-h"])
    text = parser.format_help()
    assert "--config-file" not in text and "--config_file" in text
    assert text.count("--num-processes") == 1  # named once, in the description
    assert options_to_group["use_deepspeed"] in text and options_to_group["use_fsdp"] in text
    monkeypatch.setattr(sys, "argv", ["hasten", "launch", "--use-fsdp", "-h"])
    text = parser.format_help()
    assert options_to_group["use_fsdp"] in text and options_to_group["use_deepspeed"] not in text
    # the parser itself still takes both spellings
    assert parser.parse_args(["--config-file", "x.yaml", "t.py"]).config_file == "x.yaml"


def test_simple_launcher_runs_the_script_and_raises_on_failure(tmp_path):
    ok, bad = tmp_path / "ok.py", tmp_path / "bad.py"
    marker = tmp_path / "ran"
    ok.write_text(f"import os; open({str(marker)!r}, 'w').write(os.environ['KMP_BLOCKTIME'])\n")
    bad.write_text("raise SystemExit(3)\n")
    parser = launch_command_parser()
    simple_launcher(parser.parse_args(["--cpu", str(ok)]))
    assert marker.read_text() == "1"  # the launch's environment reached the child
    with pytest.raises(subprocess.CalledProcessError) as failed:
        simple_launcher(parser.parse_args([str(bad)]))
    assert failed.value.returncode == 3
    with pytest.raises(SystemExit):
        simple_launcher(parser.parse_args(["--quiet", str(bad)]))


def test_simple_launcher_runs_a_module_with_dash_m(tmp_path):
    import json

    source, target = tmp_path / "in.json", tmp_path / "out.json"
    source.write_text('{"a": 1}')
    simple_launcher(launch_command_parser().parse_args(["--cpu", "-m", "json.tool", str(source), str(target)]))
    assert json.loads(target.read_text()) == {"a": 1}


def test_role_and_log_dir_are_what_torchruns_agent_is_given(tmp_path, monkeypatch):
    """--role names the workers' role in torchrun's agent (its workers read it as ROLE_NAME) and --log_dir is where
    it writes each worker's logs: the values handed over."""
    import hasten.launch.run as run

    given = []
    monkeypatch.setattr(run, "_start_workers", lambda config, entrypoint, args: given.append(
        (config.role, config.logs_specs.root_log_dir if config.logs_specs else None)))
    script = tmp_path / "noop.py"
    script.write_text("")
    multi_gpu_launcher(launch_command_parser().parse_args(["--cpu", "--num_processes", "2", "--role", "trainer",
                                                          "--log_dir", str(tmp_path / "logs"), str(script)]))
    assert given == [("trainer", str(tmp_path / "logs"))]


def test_multi_gpu_launcher_starts_the_processes_through_torchrun(tmp_path):
    script = tmp_path / "two.py"
    out = tmp_path / "ranks"
    out.mkdir()
    script.write_text("import os\n"
                      f"open(os.path.join({str(out)!r}, os.environ['RANK']), 'w').write(os.environ['WORLD_SIZE'])\n")
    parser = launch_command_parser()
    multi_gpu_launcher(parser.parse_args(["--cpu", "--num_processes", "2", "--monitor_interval", "0.1", str(script)]))
    assert sorted(p.name for p in out.iterdir()) == ["0", "1"] and (out / "1").read_text() == "2"
    script.write_text("raise SystemExit(4)\n")
    with pytest.raises(LaunchError, match="exit code"):
        multi_gpu_launcher(parser.parse_args(["--cpu", "--num_processes", "2", "--monitor_interval", "0.1",
                                              str(script)]))


def test_deepspeed_launcher_is_the_torchrun_launch_with_deepspeed_on(monkeypatch):
    import hasten.launch.run as launch

    seen = []
    monkeypatch.setattr(launch, "multi_gpu_launcher", lambda args: seen.append(args.use_deepspeed))
    deepspeed_launcher(launch_command_parser().parse_args(["t.py"]))
    assert seen == [True]


def test_the_cli_test_script_runs_under_launch(capfd):
    from hasten.commands.launch import launch_command
    from hasten.test_utils.testing import path_in_accelerate_package

    script = path_in_accelerate_package("test_utils", "scripts", "test_cli.py")
    assert launch_command(launch_command_parser().parse_args(["--cpu", str(script)])) in (0, None)
    assert "Successfully ran on" in capfd.readouterr().out


def test_an_untyped_fsdp_sync_module_states_reads_accelerates_true_and_the_file_still_wins(tmp_path, monkeypatch):
    from hasten.commands.launch import _validate_launch_command
    from hasten.config.launch_settings import resolve_launch

    monkeypatch.setenv("HF_HOME", str(tmp_path))  # no default config file
    parser = launch_command_parser()
    args = parser.parse_args(["t.py"])
    assert args.fsdp_sync_module_states == "true" and args.fsdp_sync_module_states  # Accelerate's parser default
    # ... which is not a typed flag: no "needs --use_fsdp" error, nothing exported, the FSDP plugin's default applies
    assert resolve_launch(args).values["fsdp_sync_module_states"].source == "default"
    assert parser.parse_args(["--use_fsdp", "--fsdp_sync_module_states", "false", "t.py"]).fsdp_sync_module_states is False
    # without a file the parser's default stays; a file's value replaces it (whatever its distributed_type), as in
    # Accelerate; a typed value beats the file
    assert _validate_launch_command(parser.parse_args(["--cpu", "t.py"]))[0].fsdp_sync_module_states == "true"
    config = tmp_path / "c.yaml"
    config.write_text("distributed_type: 'NO'\nfsdp_config:\n  fsdp_sync_module_states: false\n"
                      "deepspeed_config:\n  deepspeed_config_file: ignored.json\n")
    args = _validate_launch_command(parser.parse_args(["--config_file", str(config), "t.py"]))[0]
    assert args.fsdp_sync_module_states is False
    config.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_sync_module_states: false\n")
    args = _validate_launch_command(parser.parse_args(["--config_file", str(config), "--use_fsdp",
                                                       "--fsdp_sync_module_states", "true", "t.py"]))[0]
    assert args.fsdp_sync_module_states is True


def test_validate_launch_command_accepts_a_flag_without_its_switch_as_accelerate_and_launch_refuses_it(
        tmp_path, monkeypatch, caplog):
    from hasten.commands import launch
    from hasten.core.errors import ConfigError

    monkeypatch.setenv("HF_HOME", str(tmp_path))
    argv = ["--num-processes", "1", "--deepspeed_config_file", "path/to/be/accepted", str(tmp_path / "t.py")]
    with caplog.at_level("WARNING", logger="hasten.launch"):
        args = launch._validate_launch_command(launch.launch_command_parser().parse_args(argv))[0]
    assert args.deepspeed_config_file == "path/to/be/accepted"
    assert "--deepspeed_config_file needs --use_deepspeed" in caplog.text
    with pytest.raises(ConfigError, match="needs --use_deepspeed"):  # with --strict: hasten's one-line error
        launch._validate_launch_command(launch.launch_command_parser().parse_args(["--strict", *argv]))
    with pytest.raises(ConfigError, match="needs --use_deepspeed"):  # `hasten launch` itself refuses it
        launch.plan_launch(launch.launch_command_parser().parse_args(argv))


def test_launch_command_in_this_process_leaves_the_callers_environment_as_it_was(tmp_path, monkeypatch):
    # Accelerate's launch_command runs a child process; hasten runs one process in place: the run's variables
    # (HASTEN_DEBUG_MODE, ...) must not stay behind and beat a config file read later in the same process.
    import os

    from hasten.commands.launch import launch_command

    monkeypatch.setenv("HF_HOME", str(tmp_path))
    script = tmp_path / "t.py"
    script.write_text("import os, sys\nassert os.environ['HASTEN_DEBUG_MODE'] == 'true'\nsys.argv.append('x')\n")
    before, argv = dict(os.environ), list(sys.argv)
    assert launch_command(launch_command_parser().parse_args(["--debug", "--cpu", str(script)])) == 0
    assert dict(os.environ) == before and sys.argv == argv
