"""Bad input of every kind (config files, flags, environment values) ends in one clear line, never a traceback."""

import os
import subprocess
import sys

import pytest

from hasten.commands import cli

GOOD = "distributed_type: NO\n"
FILES = {
    "unknown key": ("num_proceses: 2\n", "did you mean 'num_processes'"),
    "integer as word": ("num_machines: two\n", "'num_machines' has value 'two'"),
    "machines without address": ("distributed_type: MULTI_CPU\nnum_machines: 2\nnum_processes: 2\n", "main_process_ip is missing"),
    "rank too high": ("num_machines: 2\nmachine_rank: 2\nmain_process_ip: 10.0.0.1\n", "machine_rank 2 must be below"),
    "unknown precision": ("mixed_precision: fp17\n", "'mixed_precision' has value 'fp17'"),
    "unknown distributed type": ("distributed_type: MULTI_TPU\n", "'distributed_type' has value 'MULTI_TPU'"),
    "broken yaml": ("num_processes: [1\n", "not valid YAML"),
    "list instead of mapping": ("- a\n- b\n", "must hold `key: value` lines"),
    "bad boolean": ("use_cpu: maybe\n", "'use_cpu' has value 'maybe'"),
    "port out of range": ("main_process_port: 70000\n", "from 0 to 65535"),
    "bad gpu ids": ("gpu_ids: 0,a\n", "'gpu_ids' has value '0,a'"),
    "unknown fsdp key": ("distributed_type: FSDP\nfsdp_config:\n  fsdp_versoin: 2\n", "did you mean 'fsdp_version'"),
    "fsdp loading without sync": ("distributed_type: FSDP\nfsdp_config:\n  fsdp_cpu_ram_efficient_loading: true\n"
                                  "  fsdp_sync_module_states: false\n", "fsdp_sync_module_states: true"),
    "sagemaker": ("compute_environment: AMAZON_SAGEMAKER\n", "Amazon SageMaker (compute_environment AMAZON_SAGEMAKER) is not built in hasten"),
    "deepspeed hostfile": ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_hostfile: hosts\n",
                           "DeepSpeed's own multi-node launchers (hostfile, pdsh, mpirun, ...) is not built"),
    "processes not divisible": ("num_processes: 3\nnum_machines: 2\nmain_process_ip: h\n", "must divide evenly"),
    "NO with many processes": ("distributed_type: NO\nnum_processes: 4\n", "distributed_type NO runs one process"),
    "bad dynamo backend": ("dynamo_config:\n  dynamo_backend: turbo\n", "dynamo_config.dynamo_backend"),
    "block not a mapping": ("fsdp_config: yes\n", "'fsdp_config' has value True"),
    "zero processes": ("num_processes: 0\n", "'num_processes' has value 0"),
    "sagemaker key": ("iam_role_name: x\n", "Amazon SageMaker config"),
    "megatron key without prefix": ("megatron_lm_config:\n  tp_degree: 2\n", "start with 'megatron_lm_'"),
    "same network with c10d": ("distributed_type: MULTI_CPU\nnum_machines: 2\nnum_processes: 2\nmain_process_ip: h\nsame_network: true\n"
                               "rdzv_backend: c10d\n", "leaves torchrun without a rendezvous endpoint"),
}
FLAGS = {
    "zero processes": (["--num_processes", "0"], "0 is not allowed"),
    "word for number": (["--num_processes", "abc"], "'abc' is not an integer"),
    "two paradigms": (["--cpu", "--multi_gpu"], "--cpu and --multi_gpu cannot be combined"),
    "deepspeed launcher": (["--use_deepspeed", "--deepspeed_multinode_launcher", "pdsh"],
                           "--deepspeed_multinode_launcher: DeepSpeed's own multi-node launchers"),
    "deepspeed option": (["--zero_stage", "2"], "--zero_stage needs --use_deepspeed"),
    "megatron sequence parallelism": (["--use_megatron_lm", "--megatron_lm_sequence_parallelism", "true"],
                                      "--megatron_lm_sequence_parallelism: Megatron"),
    "fsdp option without fsdp": (["--fsdp_version", "2"], "--fsdp_version needs --use_fsdp"),
    "module and no_python": (["-m", "--no_python"], "--module and --no_python cannot be combined"),
    "machines without address": (["--num_machines", "2", "--num_processes", "2"], "needs --main_process_ip"),
    "rank too high": (["--num_machines", "2", "--machine_rank", "2", "--main_process_ip", "h"], "must be below"),
    "bad rdzv_conf": (["--rdzv_conf", "timeout"], "is not key=value"),
    "unknown precision": (["--mixed_precision", "fp17"], "invalid choice: 'fp17'"),
    "bad port": (["--main_process_port", "99999"], "not a TCP port"),
    "dynamo mode without backend": (["--dynamo_mode", "max-autotune"], "has no effect without --dynamo_backend"),
    "multi_gpu with one process": (["--multi_gpu", "--num_processes", "1"], "needs 2 or more processes"),
    "bad gpu ids": (["--gpu_ids", "a,b"], "must be comma-separated integers"),
    "cpu with gpu ids": (["--cpu", "--gpu_ids", "0"], "--cpu and --gpu_ids 0 cannot be combined"),
    "tpu vm names": (["--tpu", "--vm", "x"], "--vm: xla_dist's TPU VM list is not built"),
    "bad fsdp boolean": (["--use_fsdp", "--fsdp_offload_params", "maybe"], "invalid truth value"),
    "unknown flag": (["--num_procs", "2"], "unrecognized arguments"),
    "missing config file": (["--config_file", "/nonexistent/c.yaml"], "does not exist"),
    "fsdp loading without sync": (["--use_fsdp", "--fsdp_cpu_ram_efficient_loading", "true",
                                   "--fsdp_sync_module_states", "false"], "would keep empty weights"),
    "negative monitor interval": (["--monitor_interval", "-1"], "negative"),
    "same network without static rendezvous": (["--num_machines", "2", "--num_processes", "2", "--main_process_ip", "h",
                                                "--same_network", "--rdzv_backend", "c10d"], "same_network (from"),
}
ENVIRONMENT = {
    "precision": ({"HASTEN_MIXED_PRECISION": "fp17"}, "HASTEN_MIXED_PRECISION='fp17' is not valid"),
    "boolean": ({"ACCELERATE_USE_CPU": "maybe"}, "ACCELERATE_USE_CPU='maybe' is not valid"),
    "accumulation": ({"HASTEN_GRADIENT_ACCUMULATION_STEPS": "0"}, "HASTEN_GRADIENT_ACCUMULATION_STEPS='0'"),
    "fsdp version": ({"FSDP_VERSION": "3", "HASTEN_USE_FSDP": "true"}, "FSDP_VERSION='3' is not valid"),
    "threads": ({"OMP_NUM_THREADS": "many"}, "OMP_NUM_THREADS='many' is not valid"),
    "dynamo": ({"HASTEN_DYNAMO_BACKEND": "turbo"}, "HASTEN_DYNAMO_BACKEND='turbo'"),
    "slurm node id": ({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NNODES": "two"}, "SLURM_NNODES='two'"),
}
OTHER = {
    "update missing file": (["config", "update", "--config_file", "/nonexistent/c.yaml"], "does not exist"),
    "default bad precision": (["config", "default", "--mixed_precision", "fp17"], "invalid choice"),
    "unknown config action": (["config", "bogus"], "unknown action 'bogus'"),
    "explain with bad file": (["config", "explain", "--config_file", "{bad}"], "did you mean 'num_processes'"),
    "estimate hub name": (["estimate-memory", "gpt2"], "does not download from the Hub"),
    "estimate missing module": (["estimate-memory", "no_such_module_xyz:build"], "cannot import 'no_such_module_xyz'"),
    "estimate bad dtype": (["estimate-memory", "--dtypes", "int3", "x:y"], "'int3' is not one of"),
    "estimate not a module": (["estimate-memory", "os:getcwd"], "not a torch.nn.Module"),
    "unknown command": (["lanch"], "unknown command 'lanch'"),
}

CASES = (
    [("file: " + name, "file", text, expected) for name, (text, expected) in FILES.items()]
    + [("flag: " + name, "flags", flags, expected) for name, (flags, expected) in FLAGS.items()]
    + [("environment: " + name, "env", env, expected) for name, (env, expected) in ENVIRONMENT.items()]
    + [("command: " + name, "argv", argv, expected) for name, (argv, expected) in OTHER.items()]
)


def test_the_table_is_large_enough():
    assert len(CASES) >= 30


def _argv(kind, payload, tmp_path, monkeypatch):
    bad = tmp_path / "bad.yaml"
    bad.write_text(FILES["unknown key"][0])
    script = str(tmp_path / "never_run.py")
    if kind == "file":
        path = tmp_path / "hf" / "hasten" / "default_config.yaml"
        path.parent.mkdir(parents=True)
        path.write_text(payload)
        return ["launch", script]
    if kind == "flags":
        return ["launch", *payload, script]
    if kind == "env":
        for key, value in payload.items():
            monkeypatch.setenv(key, value)
        return ["launch", script]
    return [arg.replace("{bad}", str(bad)) for arg in payload]


@pytest.mark.parametrize("name,kind,payload,expected", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gives_one_clear_line(name, kind, payload, expected, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    argv = _argv(kind, payload, tmp_path, monkeypatch)
    try:
        code = cli.main(argv)
    except SystemExit as exit_:  # argparse
        code = exit_.code
    err = capsys.readouterr().err.strip()
    assert code not in (0, None), f"{name}: accepted"
    assert expected in err, f"{name}: {err!r}"
    assert len(err.splitlines()) == 1, f"{name}: more than one line:\n{err}"
    assert "Traceback" not in err


SUBPROCESS_CASES = [CASES[0], CASES[3], CASES[len(FILES) + 2], CASES[len(FILES) + 3],
                    CASES[len(FILES) + len(FLAGS)], CASES[-1]]


@pytest.mark.parametrize("name,kind,payload,expected", SUBPROCESS_CASES, ids=[c[0] for c in SUBPROCESS_CASES])
def test_bad_input_in_a_real_process_ends_quickly_without_traceback(name, kind, payload, expected, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    argv = _argv(kind, payload, tmp_path, monkeypatch)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HASTEN_", "ACCELERATE_"))}
    if kind == "env":
        env.update(payload)
    result = subprocess.run([sys.executable, "-m", "hasten", *argv], capture_output=True, text=True, timeout=60,
                            env=env, cwd=tmp_path)
    assert result.returncode != 0
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
