"""`hasten config` (questionnaire in a real terminal, default, update, explain), `hasten test`, `estimate-memory`."""

import io
import json
import os
import pty
import select
import subprocess
import sys
import time

import pytest
import yaml

from hasten.commands import cli
from hasten.config import file as config_file


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return tmp_path


def clean_env(home):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HASTEN_", "ACCELERATE_"))}
    env["HF_HOME"] = str(home / "hf")
    return env


class Terminal:
    """A child process on a pseudo-terminal; `expect` waits (bounded) for text, `send` types a line."""

    def __init__(self, argv, env):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execve(argv[0], argv, env)
        self.seen = ""

    def expect(self, text, timeout=60):
        deadline = time.monotonic() + timeout
        while text not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"timed out waiting for {text!r}; terminal shows:\n{self.seen[-2000:]}"
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.fd, 4096).decode(errors="replace")
                except OSError:
                    chunk = ""
                assert chunk, f"process ended before {text!r}; terminal shows:\n{self.seen[-2000:]}"
                self.seen += chunk
        self.seen = self.seen[self.seen.index(text) + len(text):]

    def send(self, line):
        os.write(self.fd, (line + "\n").encode())

    def wait(self, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            try:
                ready, _, _ = select.select([self.fd], [], [], 0.2)
                if ready:
                    self.seen += os.read(self.fd, 4096).decode(errors="replace")
            except OSError:
                time.sleep(0.1)
        os.kill(self.pid, 9)
        raise AssertionError("questionnaire did not finish")


def test_questionnaire_in_a_terminal_writes_the_expected_file(home):
    target = home / "answers.yaml"
    terminal = Terminal([sys.executable, "-m", "hasten", "config", "--config_file", str(target)], clean_env(home))
    answers = [
        ("Which kind of run", None), ("Your choice", "1"),            # several CPU processes
        ("How many machines", "2"),
        ("Rank of this machine", "7"),                                  # out of range: asked again
        ("give 0 to 1", None), ("Rank of this machine", "1"),
        ("Address", "10.0.0.1"),
        ("Port on the main machine [29500]", ""),                       # Enter keeps the default
        ("rendezvous", None), ("Your choice", "1"),                     # c10d
        ("same network", "yes"),
        ("How many processes in total", "4"),
        ("torch.compile", "no"),
        ("debug mode", "y"),
        ("Which mixed precision", None), ("Your choice", "2"),          # bf16
    ]
    for prompt, answer in answers:
        terminal.expect(prompt)
        if answer is not None:
            terminal.send(answer)
    terminal.expect("wrote")
    assert terminal.wait() == 0
    written = yaml.safe_load(target.read_text())
    assert written == {
        "compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_CPU", "mixed_precision": "bf16",
        "use_cpu": True, "debug": True, "num_processes": 4, "num_machines": 2, "machine_rank": 1,
        "main_process_ip": "10.0.0.1", "main_process_port": 29500, "rdzv_backend": "c10d", "same_network": True,
    }
    assert config_file.load_config_file(str(target))["num_processes"] == 4


def test_questionnaire_without_answers_stops_with_a_message(home, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # no terminal, no input: must not wait forever
    assert cli.main(["config"]) == 2
    err = capsys.readouterr().err
    assert "hasten config default" in err and len(err.strip().splitlines()) == 1
    assert not os.path.exists(config_file.default_config_path())


def test_config_default_then_update_then_explain(home, capsys):
    assert cli.main(["config", "default", "--mixed_precision", "bf16"]) == 0
    path = config_file.default_config_path()
    assert config_file.load_config_file(path)["mixed_precision"] == "bf16"
    assert cli.main(["config", "default"]) == 1  # refuses to overwrite
    written = json.loads(open(path).read())  # JSON text, as Accelerate's `accelerate config default`
    with open(path, "w") as handle:
        handle.write(json.dumps({**written, "fp16": True}))  # legacy key: update rewrites it into the current form
    assert cli.main(["config", "update"]) == 0
    assert "fp16" not in yaml.safe_load(open(path))
    capsys.readouterr()
    # --cpu alone skips the default file, as Accelerate: name it
    assert cli.main(["config", "explain", "--all", "--num_processes", "3", "--cpu", "--config_file", path]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[3:] if line and not line.startswith(" ")}
    assert rows["mixed_precision"][:2] == ["bf16", "file"]
    assert rows["num_processes"][:2] == ["3", "flag"]
    assert rows["max_restarts"][:2] == ["0", "default"]
    assert "hasten.config.resolve.explain" in out and path in out


def test_explain_draws_a_rich_table_on_a_terminal_and_plain_columns_in_a_pipe(home):
    pytest.importorskip("rich")
    terminal = Terminal([sys.executable, "-m", "hasten", "config", "explain", "--cpu"], clean_env(home))
    terminal.expect("┃")  # rich's box drawing
    terminal.expect("use_cpu")
    terminal.expect("exported to the training processes")
    assert terminal.wait() == 0
    piped = subprocess.run([sys.executable, "-m", "hasten", "config", "explain", "--cpu"], env=clean_env(home),
                           capture_output=True, text=True, timeout=60)
    assert "┃" not in piped.stdout and any(line.split()[:3] == ["use_cpu", "true", "flag"]
                                                for line in piped.stdout.splitlines())


def test_update_reads_an_accelerate_file_and_writes_hastens(home, capsys):
    accelerate = home / "hf" / "accelerate" / "default_config.yaml"
    accelerate.parent.mkdir(parents=True)
    accelerate.write_text("distributed_type: MULTI_CPU\nnum_processes: 2\nuse_cpu: true\n")
    assert cli.main(["config", "update"]) == 0
    assert accelerate.read_text() == "distributed_type: MULTI_CPU\nnum_processes: 2\nuse_cpu: true\n"
    assert config_file.load_config_file(config_file.default_config_path())["num_processes"] == 2


def test_hasten_test_passes_with_the_users_config(home):
    config_file.write_config_file({"distributed_type": "MULTI_CPU", "num_processes": 2, "use_cpu": True},
                                  config_file.default_config_path())
    result = subprocess.run([sys.executable, "-m", "hasten", "test"], capture_output=True, text=True, timeout=240,
                            env=clean_env(home))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rank 0/2 ok" in result.stdout and "rank 1/2 ok" in result.stdout
    assert "Test is a success!" in result.stdout


def test_estimate_memory_from_a_factory(tmp_path, monkeypatch, capsys):
    (tmp_path / "tiny_models.py").write_text(
        "import torch\n"
        "def build():\n"
        "    return torch.nn.Sequential(torch.nn.Embedding(1000, 64), "
        "*[torch.nn.Linear(64, 64) for _ in range(3)])\n"
    )
    monkeypatch.chdir(tmp_path)
    assert cli.main(["estimate-memory", "tiny_models:build", "--dtypes", "fp32", "fp16", "int4"]) == 0
    out = capsys.readouterr().out
    total = 1000 * 64 + 3 * (64 * 64 + 64)
    assert f"parameters: {total:,}" in out and "largest layer: 0 (64,000 values)" in out
    lines = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:5]] for line in out.splitlines()
             if line.startswith("| ") and "dtype" not in line}
    assert lines["float32"] == ["250.00 KB", f"{total * 4 / 1024:.2f} KB", f"{total * 16 / 1024 / 1024:.2f} MB"]
    assert lines["float16"][1] == f"{total * 2 / 1024:.2f} KB"
    assert lines["int4"][2] == "N/A"


def test_estimate_memory_from_a_file_factory_costs_no_memory(tmp_path, capsys):
    # 4 x (20000 x 20000) float32 would be 6.4 GB if it were allocated.
    (tmp_path / "big.py").write_text(
        "import torch\n"
        "def build():\n"
        "    return torch.nn.Sequential(*[torch.nn.Linear(20000, 20000, bias=False) for _ in range(4)])\n"
    )
    assert cli.main(["estimate-memory", f"{tmp_path / 'big.py'}:build", "--dtypes", "float32"]) == 0
    assert "5.96 GB" in capsys.readouterr().out


def test_estimate_memory_model_folder_needs_transformers(tmp_path, monkeypatch, capsys):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    assert cli.main(["estimate-memory", str(tmp_path)]) == 2
    assert 'pip install "hasten[estimate]"' in capsys.readouterr().err


def test_estimate_memory_model_folder(tmp_path, capsys):
    pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text(
        '{"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 1000, '
        '"bos_token_id": 0, "eos_token_id": 0}')
    assert cli.main(["estimate-memory", str(tmp_path), "--dtypes", "float32"]) == 0
    out = capsys.readouterr().out
    assert "parameters: 229,632" in out and "largest layer: wpe" in out


def test_questionnaire_on_a_gpu_machine_with_fsdp():
    from hasten.commands.config import Questions, questionnaire

    answers = iter([
        "3",        # FSDP
        "",         # 1 machine
        "",         # processes: default = the 4 GPUs found
        "0,1,2,3",  # GPU ids
        "", "", "", "",  # FSDP2, reshard yes, no offload, wrap by layer class
        "LlamaDecoderLayer", "", "yes", "no",  # layer class, sharded checkpoints, rank-0 loading, no recompute
        "yes", "0", "2", "no", "no",  # torch.compile: inductor, max-autotune
        "no",       # debug
        "bf16",     # mixed precision by name
    ])
    shown = []
    config = questionnaire(Questions(read=lambda prompt: next(answers), write=shown.append),
                           {"device": "cuda", "device_count": 4, "cpu_cores": 32})
    assert config["distributed_type"] == "FSDP" and config["num_processes"] == 4 and config["use_cpu"] is False
    assert config["fsdp_config"] == {
        "fsdp_version": 2, "fsdp_reshard_after_forward": True, "fsdp_offload_params": False,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
        "fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_cpu_ram_efficient_loading": True,
        "fsdp_sync_module_states": True, "fsdp_activation_checkpointing": False,
    }
    assert config["dynamo_config"]["dynamo_backend"] == "inductor"
    assert config["dynamo_config"]["dynamo_mode"] == "max-autotune"
    assert config["mixed_precision"] == "bf16"
    assert any("4 cuda found" in line for line in shown)
    config_file.validate(config)  # what it builds is a valid file
