"""The config file: location, Accelerate fallback, schema checks, legacy keys, YAML/JSON round trip."""

import json
import os

import pytest

from hasten.config import file as config_file
from hasten.config.file import ConfigFileError
from hasten.core.errors import ConfigError


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return tmp_path / "hf"


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def test_default_location_follows_hf_home_then_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", "/x/hf")
    assert config_file.default_config_path() == "/x/hf/hasten/default_config.yaml"
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", "/x/cache")
    assert config_file.default_config_path() == "/x/cache/huggingface/hasten/default_config.yaml"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert config_file.default_config_path() == os.path.expanduser("~/.cache/huggingface/hasten/default_config.yaml")


def test_hasten_file_first_then_accelerate_file(hf_home):
    assert config_file.find_config_file() is None
    accelerate = write(hf_home / "accelerate" / "default_config.yaml", "distributed_type: NO\n")
    assert config_file.find_config_file() == accelerate
    own = write(hf_home / "hasten" / "default_config.yaml", "distributed_type: NO\n")
    assert config_file.find_config_file() == own
    with pytest.raises(ConfigFileError, match="does not exist"):
        config_file.find_config_file(str(hf_home / "missing.yaml"))


def test_an_accelerate_generated_file_loads(tmp_path):
    # As written by `accelerate config` for 2 GPUs with FSDP (keys with and without prefixes, empty blocks).
    path = write(tmp_path / "acc.yaml", """
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
enable_cpu_affinity: false
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_cpu_ram_efficient_loading: true
  fsdp_offload_params: false
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_version: 2
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
""")
    config = config_file.load_config_file(path)
    assert config["distributed_type"] == "FSDP"
    assert config["fsdp_config"]["fsdp_version"] == 2
    assert config["downcast_bf16"] is False
    assert config["mixed_precision"] == "bf16"


def test_legacy_keys_are_rewritten(tmp_path):
    path = write(tmp_path / "old.yaml", "distributed_type: NO\nfp16: true\ndynamo_backend: INDUCTOR\n")
    config = config_file.load_config_file(path)
    assert config["mixed_precision"] == "fp16"
    assert config["dynamo_config"]["dynamo_backend"] == "inductor"
    assert config["num_processes"] == 1  # NO means one process


def test_yaml_and_json_round_trip(tmp_path):
    config = {"distributed_type": "MULTI_CPU", "num_processes": 4, "num_machines": 2, "main_process_ip": "10.0.0.1",
              "main_process_port": 29501, "rdzv_backend": "c10d", "mixed_precision": "bf16", "use_cpu": True,
              "max_restarts": 2, "rdzv_conf": "timeout=900"}
    for name in ("c.yaml", "c.json"):
        path = config_file.write_config_file(config, str(tmp_path / name))
        loaded = config_file.load_config_file(path, fill_defaults=False)
        assert loaded == config
    assert json.loads((tmp_path / "c.json").read_text())["num_processes"] == 4


def test_error_names_file_key_value_allowed_and_fix(tmp_path):
    path = write(tmp_path / "bad.yaml", "distributed_type: NO\nmixed_precision: fp17\n")
    with pytest.raises(ConfigFileError) as caught:
        config_file.load_config_file(path)
    message = str(caught.value)
    assert path in message and "mixed_precision" in message and "fp17" in message
    assert "one of no, fp16, bf16, fp8" in message and "fix:" in message
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, ConfigError)


def test_unknown_key_suggests_the_close_one(tmp_path):
    path = write(tmp_path / "typo.yaml", "num_proceses: 2\n")
    with pytest.raises(ConfigFileError, match="did you mean 'num_processes'"):
        config_file.load_config_file(path)


def test_basic_config_for_cpu_and_gpu_machines():
    cpu = config_file.basic_config(machine={"device": "cpu", "device_count": 0, "cpu_cores": 4})
    assert (cpu["distributed_type"], cpu["num_processes"], cpu["use_cpu"]) == ("NO", 1, True)
    gpus = config_file.basic_config("bf16", machine={"device": "cuda", "device_count": 4, "cpu_cores": 32})
    assert (gpus["distributed_type"], gpus["num_processes"], gpus["use_cpu"]) == ("MULTI_GPU", 4, False)
    assert gpus["mixed_precision"] == "bf16"


def test_write_basic_config_refuses_to_overwrite(hf_home, capsys):
    path = config_file.write_basic_config()
    assert path == config_file.default_config_path()
    before = open(path).read()
    # as Accelerate: JSON text in the .yaml file (JSON is YAML too, so it loads as any config file)
    assert json.loads(before)["compute_environment"] == "LOCAL_MACHINE" and before.startswith("{")
    assert config_file.load_config_file(path)["mixed_precision"] == "no"
    assert config_file.write_basic_config(mixed_precision="bf16") is False
    assert "will not override" in capsys.readouterr().out
    assert open(path).read() == before


def test_write_basic_config_takes_a_path_object(tmp_path):
    written = config_file.write_basic_config(save_location=tmp_path / "default_config.yaml")
    assert written == str(tmp_path / "default_config.yaml") and (tmp_path / "default_config.yaml").exists()
