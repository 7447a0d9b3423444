"""One precedence: code > flag > environment > config file > default, and every value knows its source."""

import itertools
import subprocess
import sys

import pytest

from hasten.commands import config as config_command
from hasten.commands.launch import launch_command_parser, plan_launch
from hasten.config.resolve import SOURCES_VARIABLE, explain_values, resolve
from hasten.core.errors import ConfigError

# One value of mixed_precision per source, all different, so the winner shows which source won.
VALUE = {"code": "fp8", "flag": "bf16", "environment": "fp16", "file": "no", "default": "no"}
FILE_VALUE = "fp16"  # used when the file is one of the two sources compared


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return tmp_path


def write_config(home, text):
    path = home / "hf" / "hasten" / "default_config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def plan(*flags):
    return plan_launch(launch_command_parser().parse_args([*flags, "train.py"]))


@pytest.mark.parametrize("higher,lower", list(itertools.combinations(["code", "flag", "environment", "file", "default"], 2)))
def test_each_pair_of_sources_the_higher_wins(higher, lower, home, monkeypatch):
    values = {"code": "fp8", "flag": "bf16", "environment": "fp16", "file": "bf16", "default": "no"}
    if higher == "flag" and lower == "file":
        values["file"] = "fp16"
    code = {"mixed_precision": values["code"]} if "code" in (higher, lower) else None
    flags = {"mixed_precision": values["flag"]} if "flag" in (higher, lower) else None
    env = {"ACCELERATE_MIXED_PRECISION": values["environment"]} if "environment" in (higher, lower) else {}
    file_values = {"mixed_precision": values["file"]} if "file" in (higher, lower) else None
    result = resolve(code=code, flags=flags, env=env, file_values=file_values, file_path="/c.yaml")["mixed_precision"]
    assert result.source == higher
    assert result.value == values[higher]


# (sources set, winner under the launcher's default order (Accelerate's: flag > file > the launcher's default >
# environment, as its launcher writes the merged values over exported variables), winner with environment_over_file)
LAUNCH_CASES = [
    (("flag", "environment"), "flag", "flag"),
    (("flag", "file"), "flag", "flag"),
    (("flag",), "flag", "flag"),
    (("environment", "file"), "file", "environment"),
    (("environment",), "default", "environment"),
    (("file",), "file", "file"),
]


@pytest.mark.parametrize("given, accelerate_winner, hasten_winner", LAUNCH_CASES)
@pytest.mark.parametrize("environment_over_file", [False, True])
def test_launch_and_config_explain_report_the_winner(given, accelerate_winner, hasten_winner, environment_over_file,
                                                     home, monkeypatch, capsys):
    values = {"flag": "bf16", "environment": "fp8", "file": "fp16", "default": "no"}
    flags = ["--environment_over_file"] if environment_over_file else []
    if "flag" in given:
        flags += ["--mixed_precision", values["flag"]]
    if "environment" in given:
        monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", values["environment"])
    if "file" in given:
        write_config(home, f"distributed_type: NO\nmixed_precision: {values['file']}\n")
    winner = hasten_winner if environment_over_file else accelerate_winner
    launch = plan(*flags)
    resolved = launch.settings.values["mixed_precision"]
    assert (resolved.source, resolved.value) == (winner, values[winner])
    # Exported: a flag's or the file's value, and Accelerate's default where it replaces the user's variable (the
    # variable itself is overwritten too); never over the user's variable with environment_over_file.
    exported = launch.env.get("HASTEN_MIXED_PRECISION")
    assert exported == (resolved.value if winner in ("flag", "file") or "environment" in given and winner != "environment"
                        else None)
    if "environment" in given:
        assert launch.env.get("ACCELERATE_MIXED_PRECISION") == (None if winner in ("environment", "flag") else exported)
        if winner != "environment":
            assert "written over ACCELERATE_MIXED_PRECISION" in resolved.origin or winner == "flag"

    assert config_command.main(["explain", *flags]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("mixed_precision "))
    assert line.split()[1:3] == [resolved.value, winner]


def test_file_value_and_the_users_variable_end_to_end(home, tmp_path):
    """File says bf16, the user exported ACCELERATE_MIXED_PRECISION=fp16: the script runs with bf16, as under
    Accelerate's launcher; with HASTEN_ENVIRONMENT_OVER_FILE=1, with fp16."""
    config = write_config(home, "distributed_type: NO\nmixed_precision: bf16\ndebug: true\n")
    script = tmp_path / "show.py"
    script.write_text(
        "import os\n"
        "from hasten.accelerator import Accelerator\n"
        "from hasten.config.resolve import explain_values\n"
        "acc = Accelerator()\n"
        "print('PRECISION', acc.mixed_precision, os.environ['ACCELERATE_MIXED_PRECISION'])\n"
        "for name, r in explain_values(code={'gradient_accumulation_steps': 4}).items():\n"
        "    print('SOURCE', name, str(r.value).lower(), r.source)\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("HASTEN_", "ACCELERATE_"))}
    env.update(ACCELERATE_MIXED_PRECISION="fp16", HF_HOME=str(home / "hf"))
    for variables, precision, source in (({}, "bf16", "file"), ({"HASTEN_ENVIRONMENT_OVER_FILE": "1"}, "fp16",
                                                                   "environment")):
        out = subprocess.run([sys.executable, "-m", "hasten", "launch", "--config_file", config, "--cpu", str(script)],
                             env={**env, **variables}, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert f"PRECISION {precision} {precision}" in out.stdout  # the user's variable says what the script uses
        sources = {line.split()[1]: line.split()[2:] for line in out.stdout.splitlines() if line.startswith("SOURCE")}
        assert sources["mixed_precision"] == [precision, source]
        assert sources["debug"] == ["true", "file"]          # from the config file, through the launcher
        assert sources["use_cpu"] == ["true", "flag"]        # --cpu
        assert sources["gradient_accumulation_steps"] == ["4", "code"]  # nothing else sets it
        assert sources["dynamo_backend"] == ["no", "default"]
    assert config.endswith("default_config.yaml")


def test_in_script_explain_reads_the_launchers_record(monkeypatch):
    env = {"HASTEN_MIXED_PRECISION": "bf16", "HASTEN_DEBUG_MODE": "true", "ACCELERATE_USE_CPU": "1",
           SOURCES_VARIABLE: '{"mixed_precision":["flag","--mixed_precision"],"debug":["file","/c.yaml: debug"]}'}
    values = explain_values(code={"debug": False}, env=env)
    assert (values["mixed_precision"].source, values["mixed_precision"].origin) == ("flag", "--mixed_precision")
    assert values["debug"].source == "code" and values["debug"].value is False
    assert (values["use_cpu"].source, values["use_cpu"].origin) == ("environment", "ACCELERATE_USE_CPU")


def test_hasten_variable_beats_accelerate_variable(home, monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    monkeypatch.setenv("HASTEN_MIXED_PRECISION", "bf16")
    resolved = plan().settings.values["mixed_precision"]
    assert (resolved.value, resolved.origin) == ("bf16", "HASTEN_MIXED_PRECISION")


def test_fsdp_flags_and_file_are_exported_as_fsdp_variables(home, monkeypatch):
    write_config(home, "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_version: 2\n"
                       "  fsdp_offload_params: true\n  fsdp_state_dict_type: SHARDED_STATE_DICT\n")
    monkeypatch.setenv("FSDP_STATE_DICT_TYPE", "FULL_STATE_DICT")  # the file's value is written over it
    launch = plan("--fsdp_auto_wrap_policy", "size_based_wrap", "--use_fsdp", "--fsdp_min_num_params", "1000")
    assert launch.env["HASTEN_USE_FSDP"] == "true"
    assert launch.env["FSDP_AUTO_WRAP_POLICY"] == "SIZE_BASED_WRAP"
    assert launch.env["FSDP_MIN_NUM_PARAMS"] == "1000"
    assert launch.env["FSDP_VERSION"] == "2"  # flags and the file's fsdp block combine
    assert launch.env["FSDP_STATE_DICT_TYPE"] == "SHARDED_STATE_DICT"
    # --cpu replaces the file's distributed_type, and its fsdp block with it.
    launch = plan("--cpu")
    assert not [name for name in launch.env if "FSDP" in name]
    launch = plan()
    assert launch.env["HASTEN_USE_FSDP"] == "true"
    assert (launch.env["FSDP_VERSION"], launch.env["FSDP_OFFLOAD_PARAMS"]) == ("2", "true")
    assert launch.env["FSDP_STATE_DICT_TYPE"] == "SHARDED_STATE_DICT"
    assert launch.settings.values["fsdp_state_dict_type"].source == "file"
    assert launch.num_processes == 2
    # hasten's order (environment_over_file): the user's variable beats the file and is left as it is.
    launch = plan("--environment_over_file")
    assert "FSDP_STATE_DICT_TYPE" not in launch.env
    assert launch.settings.values["fsdp_state_dict_type"].source == "environment"


# What Accelerate 1.15's launcher writes for `--use_fsdp` when nothing sets these (its launch flags' defaults)
ACCELERATE_FSDP_EXPORTS = {
    "FSDP_VERSION": "1", "FSDP_SHARDING_STRATEGY": "FULL_SHARD", "FSDP_RESHARD_AFTER_FORWARD": "true",
    "FSDP_OFFLOAD_PARAMS": "false", "FSDP_MIN_NUM_PARAMS": "100000000", "FSDP_FORWARD_PREFETCH": "false",
    "FSDP_USE_ORIG_PARAMS": "true", "FSDP_CPU_RAM_EFFICIENT_LOADING": "true", "FSDP_SYNC_MODULE_STATES": "true",
    "FSDP_ACTIVATION_CHECKPOINTING": "false", "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD": "false",
}


def test_fsdp_launch_exports_accelerates_defaults_and_the_plugin_matches(home, monkeypatch):
    import warnings

    from hasten.utils import FullyShardedDataParallelPlugin

    monkeypatch.setenv("FSDP_USE_ORIG_PARAMS", "false")  # written over, as Accelerate's launcher does
    launch = plan("--use_fsdp", "--num_processes", "2")
    assert {k: v for k, v in launch.env.items() if k.startswith("FSDP_")} == ACCELERATE_FSDP_EXPORTS
    assert launch.settings.values["fsdp_use_orig_params"].source == "default"
    assert plan("--use_fsdp", "--num_processes", "2", "--environment_over_file").env.get("FSDP_USE_ORIG_PARAMS") is None
    monkeypatch.delenv("FSDP_USE_ORIG_PARAMS")
    # A script launched that way gets Accelerate's plugin (FSDP1) ...
    with monkeypatch.context() as env:
        for name, value in launch.env.items():
            env.setenv(name, value)
        plugin = FullyShardedDataParallelPlugin()
    assert (plugin.fsdp_version, plugin.sharding_strategy.name, plugin.use_orig_params, plugin.sync_module_states,
            plugin.cpu_ram_efficient_loading, plugin.min_num_params) == (1, "FULL_SHARD", True, True, True, 10**8)
    # ... and with fsdp_version 2 the FSDP1-only defaults the launcher wrote are dropped without a warning.
    launch = plan("--use_fsdp", "--num_processes", "2", "--fsdp_version", "2")
    assert launch.env["FSDP_USE_ORIG_PARAMS"] == "true" and launch.env["FSDP_VERSION"] == "2"
    with monkeypatch.context() as env, warnings.catch_warnings():
        warnings.simplefilter("error")
        for name, value in launch.env.items():
            env.setenv(name, value)
        plugin = FullyShardedDataParallelPlugin()
    assert (plugin.fsdp_version, plugin.reshard_after_forward, plugin.use_orig_params) == (2, True, None)
    # Accelerate refuses cpu_ram_efficient_loading (on by default) without sync_module_states, and so does hasten.
    with pytest.raises(ConfigError, match="fsdp_sync_module_states true"):
        plan("--use_fsdp", "--num_processes", "2", "--fsdp_sync_module_states", "false")


def test_file_supplies_multi_machine_settings(home):
    write_config(home, "distributed_type: MULTI_CPU\nuse_cpu: true\nnum_processes: 4\nnum_machines: 2\n"
                       "machine_rank: 1\nmain_process_ip: 10.1.2.3\nmain_process_port: 29600\nrdzv_backend: c10d\n"
                       "rdzv_conf: timeout=90\nmax_restarts: 3\nmonitor_interval: 0.5\n")
    launch = plan("--machine_rank", "0")
    assert (launch.num_processes, launch.num_machines, launch.machine_rank) == (4, 2, 0)
    assert (launch.main_process_ip, launch.main_process_port, launch.rdzv_backend) == ("10.1.2.3", 29600, "c10d")
    assert (launch.rdzv_conf, launch.max_restarts, launch.monitor_interval) == ({"timeout": "90"}, 3, 0.5)
    assert launch.nproc_per_node == 2
    assert launch.settings.values["machine_rank"].source == "flag"


def test_slurm_step_needs_no_flags(home, monkeypatch):
    slurm = {"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NNODES": "3", "SLURM_NTASKS": "3",
             "SLURM_NODEID": "2", "SLURM_STEP_NODELIST": "gpu[07-09]", "SLURM_STEP_TASKS_PER_NODE": "1(x3)",
             "SLURM_GPUS_ON_NODE": "4"}
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    launch = plan()
    assert (launch.num_machines, launch.machine_rank, launch.main_process_ip) == (3, 2, "gpu07")
    assert launch.num_processes == 12 and launch.nproc_per_node == 4
    assert launch.settings.values["num_machines"].source == "environment"
    # One srun task per process: every task runs the script in place and reads SLURM itself.
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_NNODES", "2")
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "4(x2)")
    launch = plan()
    assert (launch.num_processes, launch.num_machines) == (1, 1)


def test_paradigm_flag_replaces_the_files_distributed_type(home):
    write_config(home, "distributed_type: XLA\n")
    assert plan().settings["tpu"] is True
    launch = plan("--cpu")
    assert launch.settings["tpu"] is not True
    assert launch.env["HASTEN_USE_CPU"] == "true"
    write_config(home, "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  zero_stage: 3\n")
    launch = plan()
    assert launch.env["HASTEN_USE_DEEPSPEED"] == "true" and launch.env["HASTEN_DEEPSPEED_ZERO_STAGE"] == "3"
    launch = plan("--cpu")  # the flag replaces the file's DeepSpeed: none of its variables are passed on
    assert "HASTEN_USE_DEEPSPEED" not in launch.env and "HASTEN_DEEPSPEED_ZERO_STAGE" not in launch.env


def test_the_two_documented_exceptions_to_code_wins():
    env = {"HASTEN_GRADIENT_ACCUMULATION_STEPS": "8", "ACCELERATE_USE_CPU": "true"}
    values = resolve(code={"gradient_accumulation_steps": 2, "cpu": False, "mixed_precision": "bf16"}, env=env)
    assert (values["gradient_accumulation_steps"].value, values["gradient_accumulation_steps"].source) == (8, "environment")
    assert (values["use_cpu"].value, values["use_cpu"].source) == (True, "environment")
    values = resolve(code={"cpu": True}, env={"ACCELERATE_USE_CPU": "false"})
    assert (values["use_cpu"].value, values["use_cpu"].source) == (True, "code")


def test_multi_device_switch_asks_for_one_process_per_device_and_at_least_two(home):
    """`--multi_gpu` (no GPU here): the plan starts 2 processes, and a layout of 1 process is refused in one line."""
    assert plan("--multi_gpu").num_processes == 2
    assert plan().num_processes == 1  # without it: one per GPU, at least 1
    with pytest.raises(ConfigError, match=r"multi-GPU \(from --multi_gpu\) needs 2 or more processes"):
        plan("--multi_gpu", "--num_processes", "1")


def test_tee_reaches_torchrun_logs_specs():
    """`--tee` is handed to torchrun's log handling (which streams of each process are copied to the console)."""
    from torch.distributed.elastic.multiprocessing import Std

    from hasten.commands.launch import _logs_specs

    assert _logs_specs(launch_command_parser().parse_args(["train.py"])) is None  # nothing asked: torch's default
    for value, expected in (("1", Std.OUT), ("2", Std.ERR), ("3", Std.ALL)):
        specs = _logs_specs(launch_command_parser().parse_args(["--tee", value, "train.py"]))
        assert specs._tee == expected  # torch keeps it private; the one place to read it back


def test_strict_setting_is_off_by_default_and_read_from_flag_variable_and_file(home, tmp_path, monkeypatch):
    from hasten.config.resolve import strict

    monkeypatch.delenv("HASTEN_STRICT", raising=False)
    assert strict() is False
    monkeypatch.setenv("HASTEN_STRICT", "1")
    assert strict() is True
    monkeypatch.setenv("HASTEN_STRICT", "no")
    assert strict() is False
    monkeypatch.delenv("HASTEN_STRICT")
    # The launcher exports the flag and the config file's `strict: true` to the processes as HASTEN_STRICT.
    config = tmp_path / "strict.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nstrict: true\n")
    for argv in (["--strict", "train.py"], ["--config_file", str(config), "train.py"]):
        plan = plan_launch(launch_command_parser().parse_args(argv))
        assert plan.env["HASTEN_STRICT"] in ("1", "true", "True"), argv


def test_cpu_alone_skips_the_default_config_file_as_accelerate(home):
    """`--cpu` without `--config_file` reads no default file (Accelerate's launch); naming the file reads it."""
    path = write_config(home, "distributed_type: MULTI_CPU\nnum_processes: 3\nmixed_precision: bf16\n")
    assert plan().num_processes == 3  # without --cpu the default file is read
    launch = plan("--cpu")
    assert launch.num_processes == 1 and launch.settings.config_path is None
    assert launch.settings.values["mixed_precision"].source == "default"
    launch = plan("--config_file", path, "--cpu")
    assert (launch.num_processes, launch.settings.values["mixed_precision"].value) == (3, "bf16")


def test_rdzv_conf_from_the_flag_or_the_file_is_what_torchrun_gets(home):
    """--rdzv_conf (or the file's rdzv_conf) becomes the rendezvous options of torchrun's LaunchConfig (the CPU part:
    two "machines" on one host rendezvous whatever is_host says; tests/commands/test_launch.py runs them)."""
    assert plan("--rdzv_conf", "is_host=1,join_timeout=120").rdzv_conf == {"is_host": "1", "join_timeout": "120"}
    write_config(home, "rdzv_conf: timeout=900\n")
    assert plan().rdzv_conf == {"timeout": "900"}


def test_launch_structure_flags_are_what_torchrun_and_the_processes_get(home, monkeypatch):
    """The CPU part of the machine-layout flags: the values handed to torchrun's LaunchConfig and exported to the
    processes (one host; tests/commands/test_launch.py runs two "machines" through c10d)."""
    from hasten.config.launch_settings import default_threads

    threads = str(default_threads(4, 2) + 1)  # never what the launcher would compute on this machine
    launch = plan("--cpu", "--num_processes", "4", "--num_machines", "2", "--machine_rank", "1", "--main_process_ip",
                  "10.1.2.3", "--main_process_port", "29555", "--rdzv_backend", "c10d", "--max_restarts", "3",
                  "--num_cpu_threads_per_process", threads, "--downcast_bf16")
    assert (launch.nproc_per_node, launch.machine_rank, launch.main_process_ip, launch.main_process_port,
            launch.rdzv_backend, launch.max_restarts) == (2, 1, "10.1.2.3", 29555, "c10d", 3)
    assert launch.env["OMP_NUM_THREADS"] == threads and launch.env["HASTEN_DOWNCAST_BF16"] == "true"
    assert plan("--gpu_ids", "1,2").env["CUDA_VISIBLE_DEVICES"] == "1,2"
    monkeypatch.delenv("OMP_NUM_THREADS")  # (the fixture's 1) nothing sets the threads: the launcher computes them
    computed = plan("--cpu", "--num_processes", "4", "--num_machines", "2", "--main_process_ip", "10.1.2.3")
    assert computed.env["OMP_NUM_THREADS"] == str(default_threads(4, 2))


def test_the_files_dynamo_block_is_what_the_processes_get(home):
    write_config(home, "distributed_type: NO\ndynamo_config:\n  dynamo_backend: INDUCTOR\n  dynamo_mode: max-autotune\n"
                       "  dynamo_use_regional_compilation: true\n")
    env = plan().env
    assert (env["HASTEN_DYNAMO_BACKEND"], env["HASTEN_DYNAMO_MODE"], env["HASTEN_DYNAMO_USE_REGIONAL_COMPILATION"]) == (
        "inductor", "max-autotune", "true")
