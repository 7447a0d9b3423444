"""Config files as objects, at Accelerate's path: BaseConfig, ClusterConfig, SageMakerConfig, load_config_from_file."""

import json

import pytest
import yaml

from hasten.commands.config.config_args import BaseConfig, ClusterConfig, SageMakerConfig, load_config_from_file


def test_cluster_config_is_a_checked_base_config_that_round_trips(tmp_path):
    config = ClusterConfig(compute_environment="LOCAL_MACHINE", distributed_type="MULTI_GPU", mixed_precision="bf16",
                           num_processes=2, enable_cpu_affinity=True)
    assert isinstance(config, BaseConfig)
    assert (config.distributed_type, config.num_processes, config.enable_cpu_affinity) == ("MULTI_GPU", 2, True)
    assert config.use_cpu is False and config.debug is False  # missing keys at their default
    config.to_yaml_file(str(tmp_path / "c.yaml"))
    config.to_json_file(str(tmp_path / "c.json"))
    for loaded in (load_config_from_file(str(tmp_path / "c.yaml")), ClusterConfig.from_json_file(str(tmp_path / "c.json")),
                   ClusterConfig.from_yaml_file(str(tmp_path / "c.yaml"))):
        assert type(loaded) is ClusterConfig and loaded.to_dict() == config.to_dict()
    with pytest.raises(ValueError, match="num_processs"):
        ClusterConfig(distributed_type="NO", num_processs=2)


def test_base_config_holds_the_common_keys_only(tmp_path):
    config = BaseConfig(compute_environment="LOCAL_MACHINE", distributed_type="NO", mixed_precision="fp16")
    assert (config.mixed_precision, config.use_cpu, config.debug) == ("fp16", False, False)
    config.to_json_file(str(tmp_path / "b.json"))
    assert json.loads((tmp_path / "b.json").read_text())["distributed_type"] == "NO"
    assert BaseConfig.from_json_file(str(tmp_path / "b.json")).to_dict() == config.to_dict()
    with pytest.raises(ValueError, match="num_processes"):
        BaseConfig(distributed_type="NO", num_processes=2)


def test_a_sagemaker_file_loads_as_data_and_launch_refuses_it(tmp_path):
    path = tmp_path / "sm.yaml"
    path.write_text(yaml.safe_dump({
        "compute_environment": "AMAZON_SAGEMAKER", "distributed_type": "NO", "fp16": True,
        "ec2_instance_type": "ml.p3.2xlarge", "iam_role_name": "role", "region": "eu-west-1",
    }))
    config = load_config_from_file(str(path))
    assert type(config) is SageMakerConfig and isinstance(config, BaseConfig)
    assert (config.ec2_instance_type, config.region, config.mixed_precision, config.num_machines) == (
        "ml.p3.2xlarge", "eu-west-1", "fp16", 1)
    config.to_yaml_file(str(tmp_path / "again.yaml"))
    assert SageMakerConfig.from_yaml_file(str(tmp_path / "again.yaml")).to_dict() == config.to_dict()
    with pytest.raises(ValueError, match="iam_role_name"):
        SageMakerConfig(distributed_type="NO", ec2_instance_type="x")
    with pytest.raises(ValueError, match="not_a_key"):
        SageMakerConfig(distributed_type="NO", ec2_instance_type="x", iam_role_name="r", not_a_key=1)
    with pytest.raises(ValueError, match="ClusterConfig"):
        SageMakerConfig(compute_environment="LOCAL_MACHINE", distributed_type="NO", ec2_instance_type="x",
                        iam_role_name="r")
    # Nothing runs it: a ClusterConfig (what the launcher reads) refuses the same file in one line.
    with pytest.raises(ValueError, match="SageMaker"):
        ClusterConfig.from_yaml_file(str(path))


def test_a_one_process_config_with_many_processes_builds_and_only_its_launch_is_refused(tmp_path, capsys):
    # Accelerate builds and writes such a config; launching it would run one process and drop num_processes.
    config = ClusterConfig(compute_environment="LOCAL_MACHINE", distributed_type="NO", mixed_precision="fp16",
                           num_processes=2, debug=False, use_cpu=False)
    assert (config.distributed_type, config.num_processes, config.mixed_precision) == ("NO", 2, "fp16")
    path = str(tmp_path / "no.yaml")
    config.to_yaml_file(path)
    assert load_config_from_file(path).num_processes == 2
    script = tmp_path / "train.py"
    script.write_text("print('RAN')\n")
    from hasten.commands import launch

    assert launch.main(["--config_file", path, str(script)]) == 2
    err = capsys.readouterr().err
    assert "distributed_type NO runs one process but num_processes is 2" in err and "RAN" not in err
    assert len(err.strip().splitlines()) == 1
