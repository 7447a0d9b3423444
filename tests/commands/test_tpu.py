"""`hasten tpu-config`: the gcloud command it composes from flags and the config file, and running it."""

from __future__ import annotations

import os
import stat
import sys

import pytest
import yaml

from hasten.commands import cli
from hasten.commands.tpu import tpu_command_launcher, tpu_command_parser

SSH = "Running gcloud compute tpus tpu-vm ssh"


@pytest.fixture
def home(tmp_path, monkeypatch):
    """No default config file unless a test writes one."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return tmp_path


def printed(capsys, *argv) -> str:
    tpu_command_launcher(tpu_command_parser().parse_args([*argv, "--debug"]))
    return capsys.readouterr().out.strip()


def config(home, **keys) -> str:
    path = home / "tpu.yaml"
    path.write_text(yaml.safe_dump({"compute_environment": "LOCAL_MACHINE", "distributed_type": "NO", **keys}))
    return str(path)


def test_flags_compose_accelerates_gcloud_command(home, capsys):
    assert printed(capsys, "--tpu_name", "pod", "--tpu_zone", "us-central1-a", "--command", "ls") == (
        f"{SSH} pod --zone us-central1-a --command cd /usr/share; ls --worker all")
    # the words of one --command make one command; --command repeats; --use_alpha
    assert printed(capsys, "--tpu_name", "pod", "--tpu_zone", "z", "--use_alpha", "--command", "pip", "install", "x",
                   "--command", "ls") == (
        "Running gcloud alpha compute tpus tpu-vm ssh pod --zone z --command cd /usr/share; pip install x; ls "
        "--worker all")


def test_the_config_files_tpu_keys_fill_what_the_flags_leave_out(home, capsys):
    commands = home / "commands.sh"
    commands.write_text('echo "one"\necho two\n')
    path = config(home, tpu_name="test-tpu", tpu_zone="zone-a", command_file=str(commands), commands=["date"])
    # the file's command_file beats its commands, as in Accelerate
    assert printed(capsys, "--config_file", path) == (
        f'{SSH} test-tpu --zone zone-a --command cd /usr/share; echo "one"; echo two --worker all')
    # a typed --command beats both; typed names beat the file's
    assert printed(capsys, "--config_file", path, "--command", "ls", "--tpu_name", "other") == (
        f"{SSH} other --zone zone-a --command cd /usr/share; ls --worker all")
    # the default config file is read when no --config_file is given
    default = home / "hf" / "hasten" / "default_config.yaml"
    default.parent.mkdir(parents=True)
    default.write_text(yaml.safe_dump({"distributed_type": "NO", "tpu_name": "dflt", "tpu_zone": "z",
                                       "commands": "uptime"}))
    assert printed(capsys) == f"{SSH} dflt --zone z --command cd /usr/share; uptime --worker all"


@pytest.mark.parametrize("flags, step", [
    (["--install_accelerate"], "pip install accelerate -U"),
    (["--install_accelerate", "--accelerate_version", "1.15.0"], "pip install accelerate==1.15.0"),
    (["--install_accelerate", "--accelerate_version", "dev"],
     "pip install git+https://github.com/huggingface/accelerate.git"),
    (["--install_hasten"], "pip install hasten -U"),
    (["--install_hasten", "--hasten_version", "0.1.0"], "pip install hasten==0.1.0"),
    (["--install_hasten", "--hasten_version", "./hasten-0.1.0.tar.gz"], "pip install ./hasten-0.1.0.tar.gz"),
])
def test_install_steps_come_right_after_cd(home, capsys, flags, step):
    assert printed(capsys, "--tpu_name", "p", "--tpu_zone", "z", "--command", "ls", *flags) == (
        f"{SSH} p --zone z --command cd /usr/share; {step}; ls --worker all")


def test_mistakes_are_one_line(home, capsys):
    assert cli.main(["tpu-config", "--tpu_name", "p", "--tpu_zone", "z"]) == 2
    err = capsys.readouterr().err.strip()
    assert "You must specify either a command file or a command to run on the pod" in err
    assert cli.main(["tpu-config", "--command", "ls"]) == 2
    assert "fix: pass --tpu_name and --tpu_zone" in capsys.readouterr().err
    assert cli.main(["tpu-config", "--tpu_name", "p", "--tpu_zone", "z", "--command_file", str(home / "none")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot be read" in err
    assert cli.main(["tpu-config", "--install_hasten", "--hasten_version", "dev", "--tpu_name", "p", "--tpu_zone",
                     "z", "--command", "ls"]) == 2
    assert "hasten has no development source" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a misspelt flag is reported as such
        cli.main(["tpu-config", "--tpu_nmae", "pod"])
    assert "unrecognized arguments" in capsys.readouterr().err


def test_it_runs_gcloud_and_a_tpu_training_config_goes_to_the_tpu_launcher(home, capsys, monkeypatch):
    bin_dir = home / "bin"
    bin_dir.mkdir()
    record = home / "argv.txt"
    fake = bin_dir / "gcloud"
    fake.write_text(f"#!{sys.executable}\nimport sys\nopen({str(record)!r}, 'w').write('\\n'.join(sys.argv[1:]))\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    # a TPU training config: tpu-config reads its keys (it trains nothing) ...
    path = config(home, distributed_type="XLA", tpu_name="pod", tpu_zone="z", commands=["ls -l", "date"])
    assert cli.main(["tpu-config", "--config_file", path]) == 0
    assert "Successfully setup pod." in capsys.readouterr().out
    assert record.read_text().splitlines() == [
        "compute", "tpus", "tpu-vm", "ssh", "pod", "--zone", "z", "--command", "cd /usr/share; ls -l; date",
        "--worker", "all"]
    # ... and training on TPUs goes to the TPU launcher, which says in one line what it needs here
    script = home / "train.py"
    script.write_text("def main():\n    print('RAN')\n")
    assert cli.main(["launch", "--config_file", path, str(script)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "hasten launch --tpu needs torch_xla" in err
    # a gcloud that fails: its exit code, in one line
    fake.write_text(f"#!{sys.executable}\nimport sys\nsys.exit(3)\n")
    assert cli.main(["tpu-config", "--config_file", path]) == 3
    assert "gcloud failed with exit code 3" in capsys.readouterr().err


def test_a_config_with_tpu_config_keys_beside_a_cpu_run_loads_and_launches(home, capsys):
    from hasten.commands.config.config_args import load_config_from_file

    path = config(home, tpu_name="test-tpu", tpu_zone="us-central1-a", commands=None,
                  command_file="tests/cmds.sh", num_processes=1, use_cpu=False)
    loaded = load_config_from_file(path)
    assert (loaded.tpu_name, loaded.tpu_zone, loaded.command_file) == ("test-tpu", "us-central1-a", "tests/cmds.sh")
    script = home / "train.py"
    script.write_text("print('RAN')\n")
    assert cli.main(["launch", "--config_file", path, str(script)]) == 0
    assert "RAN" in capsys.readouterr().out


def test_a_pod_launch_runs_hasten_launch_tpu_on_every_worker_through_gcloud(home, capsys, monkeypatch):
    """`--tpu_cluster` (tpu_use_cluster) composes Accelerate's per-worker command: `hasten launch --tpu
    --no_tpu_cluster ...` with the script, its arguments, --env variables and ACCELERATE_IN_TPU_POD=1."""
    bin_dir = home / "bin"
    bin_dir.mkdir()
    record = home / "argv.txt"
    fake = bin_dir / "gcloud"
    fake.write_text(f"#!{sys.executable}\nimport sys\nopen({str(record)!r}, 'w').write('\\n'.join(sys.argv[1:]))\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    path = config(home, distributed_type="XLA", tpu_name="pod", tpu_zone="z", tpu_use_cluster=True,
                  tpu_use_sudo=True, num_processes=8, main_training_function="train", tpu_env=["B=2"])
    script = home / "train.py"
    script.write_text("def train():\n    pass\n")
    assert cli.main(["launch", "--config_file", path, "--env", "A=1", str(script), "--lr", "3"]) == 0
    argv = record.read_text().splitlines()
    assert argv[:7] == ["compute", "tpus", "tpu-vm", "ssh", "pod", "--zone", "z"]
    assert argv[-2:] == ["--worker", "all"]
    remote = argv[argv.index("--command") + 1]
    assert remote.startswith(f"cd {os.getcwd()}; sudo env ")
    assert "A=1" in remote and "B=2" in remote and "ACCELERATE_IN_TPU_POD=1" in remote  # --env, tpu_env
    assert ("hasten launch --tpu --no_tpu_cluster --num_machines 1 --mixed_precision no --dynamo_backend no "
            f"--num_processes 8 --main_training_function train {script} --lr 3") in remote
    # --no_tpu_cluster: this host only (which needs torch_xla, absent here: one line)
    record.unlink()
    assert cli.main(["launch", "--config_file", path, "--no_tpu_cluster", str(script)]) == 1
    assert "hasten launch --tpu needs torch_xla" in capsys.readouterr().err and not record.exists()
    # without the pod's name and zone: one line saying which keys to set
    path = config(home, distributed_type="XLA", tpu_use_cluster=True, num_processes=8)
    assert cli.main(["launch", "--config_file", path, str(script)]) == 2
    assert "set tpu_name and tpu_zone" in capsys.readouterr().err


@pytest.mark.parametrize("downcast, variable", [(False, "XLA_USE_BF16"), (True, "XLA_DOWNCAST_BF16")])
def test_prepare_tpu_sets_the_xla_bf16_variable_on_a_tpu(downcast, variable, monkeypatch):
    """`--mixed_precision bf16` on a TPU: XLA_USE_BF16=1, or XLA_DOWNCAST_BF16=1 with --downcast_bf16 (downcast_bf16);
    off a TPU nothing; --debug turns on debug mode in the replicas."""
    import argparse

    from hasten.core import availability
    from hasten.launch.tpu import prepare_tpu

    args = argparse.Namespace(mixed_precision="bf16", downcast_bf16=downcast, debug=True)
    monkeypatch.setattr(availability, "is_torch_xla_available", lambda check_is_tpu=False, check_is_gpu=False: True)
    assert prepare_tpu(args, {})[1] == {variable: "1", "ACCELERATE_DEBUG_MODE": "true"}
    monkeypatch.setattr(availability, "is_torch_xla_available", lambda check_is_tpu=False, check_is_gpu=False: not check_is_tpu)
    assert prepare_tpu(args, {})[1] == {"ACCELERATE_DEBUG_MODE": "true"}


@pytest.fixture
def fake_xmp(monkeypatch):
    """A stand-in `torch_xla.distributed.xla_multiprocessing` whose `spawn` records the replica count it is asked for
    and runs the replica once (index 0). The real launches run in tests/xla, in the side environment."""
    import importlib.machinery
    import types

    calls = []

    def spawn(function, args=(), nprocs=None, start_method="spawn"):
        calls.append(nprocs)
        function(0, *args)

    for name in ("torch_xla", "torch_xla.distributed", "torch_xla.distributed.xla_multiprocessing"):
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        monkeypatch.setitem(sys.modules, name, module)
    sys.modules["torch_xla.distributed.xla_multiprocessing"].spawn = spawn
    return calls


@pytest.mark.parametrize("flags, nprocs", [([], None), (["--num_processes", "1"], 1), (["--num_processes", "8"], None)])
def test_a_tpu_launch_without_a_count_spawns_a_replica_per_device(home, capsys, fake_xmp, flags, nprocs, monkeypatch):
    """As Accelerate's TPU launcher (`xmp.spawn` without `nprocs`): no --num_processes anywhere means every device
    of the host, not the default 1 (one core of eight); a given 1 still means one replica (torch_xla's spawn takes
    1 or every device)."""
    monkeypatch.chdir(home)
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    script = home / "tpu_main_script.py"
    script.write_text("def main():\n    print('RAN')\n")
    assert cli.main(["launch", "--tpu", *flags, str(script)]) == 0
    assert fake_xmp == [nprocs] and "RAN" in capsys.readouterr().out
