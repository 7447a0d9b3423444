"""The settings table is the one source: every path into a setting (code, flag, environment, file) agrees with it.

These tests iterate the table (`hasten.config.settings.SETTINGS`); they list no values by hand, so a row added
later is tested the day it is added.
"""

import warnings

import pytest

from hasten import Accelerator
from hasten.commands.launch import launch_command_parser, plan_launch
from hasten.config import file as config_file
from hasten.config import settings as table
from hasten.config.handlers import TorchDynamoPlugin
from hasten.config.deepspeed import DeepSpeedPlugin
from hasten.config.fp8 import AORecipeKwargs, TERecipeKwargs
from hasten.config.fsdp import FullyShardedDataParallelPlugin
from hasten.core.enums import DynamoBackend, PrecisionType
from hasten.core.errors import ConfigError, NotBuiltError
from hasten.parallelism_config import ParallelismConfig, TorchContextParallelConfig, TorchPipelineParallelConfig
from hasten.state import AcceleratorState
from launching import REPO

OWNERS = {"Accelerator": Accelerator, "TorchDynamoPlugin": TorchDynamoPlugin,
          "FullyShardedDataParallelPlugin": FullyShardedDataParallelPlugin, "DeepSpeedPlugin": DeepSpeedPlugin,
          "ParallelismConfig": ParallelismConfig, "TorchContextParallelConfig": TorchContextParallelConfig,
          "TERecipeKwargs": TERecipeKwargs, "AORecipeKwargs": AORecipeKwargs,
          "TorchPipelineParallelConfig": TorchPipelineParallelConfig}
ENUM_ROWS = [row for row in table.SETTINGS if row.built and row.choices and row.role == "setting"]
NOT_BUILT = [row for row in table.SETTINGS if not row.built]
UNBUILT_VALUES = [(row, value) for row in table.SETTINGS for value in row.unbuilt_values]


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for key in ("CUDA_VISIBLE_DEVICES",) + tuple(v for row in table.SETTINGS for v in row.env if v.startswith("FSDP_")):
        monkeypatch.delenv(key, raising=False)
    return tmp_path


def _context_flags(row) -> list:
    """Flags a row's flag means nothing without (--use_fsdp for FSDP rows, --mixed_precision fp8 for fp8 rows)."""
    if row.name.startswith("fp8_"):
        return ["--mixed_precision", "fp8"]
    if not row.requires:
        return []
    needed = table.BY_DEST.get(row.requires) or table.get(row.requires)
    return [needed.flags[0]] if needed.switch else [needed.flags[0], "inductor"]


def _context_file(row) -> dict:
    if row.name.startswith("fp8_"):
        return {"mixed_precision": "fp8"}
    if row.requires == "use_fsdp":
        return {"distributed_type": "FSDP"}
    if row.requires == "use_deepspeed":
        return {"distributed_type": "DEEPSPEED"}
    if row.requires == "dynamo_backend":
        return {"dynamo_config": {"dynamo_backend": "inductor"}}
    return {}


def _file_with(row, value) -> dict:
    config = _context_file(row)
    if len(row.file_key) == 1:
        config[row.file_key[0]] = value
    else:
        config.setdefault(row.file_key[0], {})[row.file_key[1]] = value
    return config


def _write(home, config) -> str:
    path = home / "hf" / "hasten" / "default_config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    import yaml

    path.write_text(yaml.safe_dump(config))
    return str(path)


def _plan(*flags):
    return plan_launch(launch_command_parser().parse_args([*flags, "train.py"]))


def _outcome(call):
    """("ok", value) or ("refused", the one-line message)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return "ok", call()
    except NotBuiltError as error:
        return "refused", str(error)
    except ConfigError as error:  # fp8 asked for on a machine that cannot run it: built, but not here
        if not str(error).startswith("mixed_precision='fp8'"):
            raise
        return "no fp8 here", str(error)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def _same(expected, used) -> bool:
    if used is None:
        return str(expected).upper() in ("NO_PREFETCH", "NO_WRAP")  # the plugin stores "none" as None
    name = str(getattr(used, "name", used)).lstrip("_")  # torch's ShardingStrategy._HYBRID_SHARD_ZERO2
    return str(name).lower() == str(expected).lower() or str(getattr(used, "value", used)).lower() == str(expected).lower()


def _used(row, obj):
    if isinstance(obj, Accelerator):
        return {"mixed_precision": obj.mixed_precision, "dynamo_backend": obj.state.dynamo_plugin.backend}[row.name]
    if row.name == "fsdp_reshard_after_forward" and getattr(obj, "fsdp_version", None) == 1:
        # FSDP1 keeps its strategy in sharding_strategy, and reshard_after_forward None unless given (as Accelerate)
        return obj.reshard_after_forward if obj.reshard_after_forward is not None else obj.sharding_strategy
    return getattr(obj, row.code)


@pytest.mark.parametrize("row", ENUM_ROWS, ids=[row.name for row in ENUM_ROWS])
def test_each_enum_value_is_accepted_or_refused_alike_by_code_flag_environment_and_file(row, home, monkeypatch):
    for value in row.choices:
        refusal = row.refusal(value)
        outcomes = {}
        if row.code:
            owner = OWNERS[row.owner]
            outcomes["code"] = _outcome(lambda: _used(row, owner(**{row.code: value})))
        if row.flags:
            flags = [*_context_flags(row), row.flags[0], str(value)]
            outcomes["flag"] = _outcome(lambda: _plan(*flags).settings.values[row.name].value)
        if row.env:
            owner = OWNERS.get(row.owner)
            monkeypatch.setenv(row.env[0], str(value))
            if owner is not None:
                outcomes["environment"] = _outcome(lambda: _used(row, owner()))
            # (with hasten's order: by default the launcher writes Accelerate's FSDP defaults over FSDP_* variables)
            outcomes["environment at launch"] = _outcome(
                lambda: _plan(*_context_flags(row), "--environment_over_file").settings.values[row.name].value)
            monkeypatch.delenv(row.env[0])
        if row.file_key:
            _write(home, _file_with(row, value))
            outcomes["file"] = _outcome(lambda: _plan().settings.values[row.name].value)
            (home / "hf" / "hasten" / "default_config.yaml").unlink()
        assert len(outcomes) >= 2, f"{row.name} has fewer than two ways in"
        for path, (kind, result) in outcomes.items():
            if kind == "no fp8 here":
                assert value == "fp8" and "compute capability >= 8.9" in result and "\n" not in result, result
                continue
            if refusal is None or path == "environment at launch":
                # The launcher passes the user's own variable on untouched; the script's Accelerator refuses it.
                assert kind == "ok", f"{row.name}={value!r} via {path}: {result}"
                assert _same(value, result), f"{row.name}={value!r} via {path} gave {result!r}"
            else:
                assert kind == "refused", f"{row.name}={value!r} via {path} was accepted: {result!r}"
                assert result.endswith(f": {refusal}") and "\n" not in result, result


def test_enums_are_the_one_source_of_allowed_values():
    assert set(table.get("mixed_precision").choices) == set(PrecisionType.list())
    backends = {b.lower() for b in DynamoBackend.list()}
    assert set(table.get("dynamo_backend").choices) == backends
    assert {"hpu_backend", "neuron"} <= backends  # accepted by Accelerator, so by the launcher and the file too
    parser = launch_command_parser()
    action = next(a for a in parser._actions if a.dest == "dynamo_backend")
    assert set(action.choices) == backends
    assert set(config_file.NESTED_KEYS["dynamo_config"]["dynamo_backend"].choices) == backends


def _sample(row):
    if row.choices:
        return row.choices[-1]
    return {"bool": True, "int": 2, "float": 1.5, "list": ["x"], "str_or_list": ["x"]}.get(row.kind, "x")


def _sample_file(row) -> dict:
    if row.kind == "dict":
        block = row.file_key[0]
        inner = next(iter(config_file.NESTED_KEYS[block].values()))
        return {block: {inner.file_key[1]: _sample(inner)}}
    return _file_with(row, _sample(row))


@pytest.mark.parametrize("row", [r for r in NOT_BUILT if r.flags], ids=[r.name for r in NOT_BUILT if r.flags])
def test_not_built_flag_is_refused_in_one_line(row, capsys):
    argv = [row.flags[0]] if row.switch else [row.flags[0], str(_sample(row))]
    with pytest.raises(NotBuiltError) as caught:
        _plan(*argv)
    message = str(caught.value)
    assert message == f"{row.flags[0]}: {row.refusal()}" and "\n" not in message
    assert "is not built in hasten yet; fix: " in message


@pytest.mark.parametrize("row", [r for r in NOT_BUILT if r.file_key], ids=[r.name for r in NOT_BUILT if r.file_key])
def test_not_built_file_key_is_refused_in_one_line(row, home):
    path = _write(home, _sample_file(row))
    for load in (lambda: config_file.load_config_file(path), lambda: _plan()):
        with pytest.raises(NotBuiltError) as caught:
            load()
        message = str(caught.value)
        assert message.startswith(path) and "\n" not in message
        assert row.feature.split(" (")[0] in message and "is not built in hasten yet; fix: " in message


@pytest.mark.parametrize("row", [r for r in NOT_BUILT if r.env], ids=[r.name for r in NOT_BUILT if r.env])
def test_not_built_variable_is_refused_by_the_script(row, monkeypatch):
    monkeypatch.setenv(row.env[-1], str(_sample(row)))
    with pytest.raises(NotBuiltError, match=f"environment variable {row.env[-1]}=") as caught:
        Accelerator()
    assert str(caught.value).endswith(row.refusal()) and "\n" not in str(caught.value)


@pytest.mark.parametrize("row,value", UNBUILT_VALUES, ids=[f"{r.name}={v}" for r, v in UNBUILT_VALUES])
def test_not_built_value_is_refused_by_flag_and_file(row, value, home):
    if row.flags:
        with pytest.raises(NotBuiltError, match=f"^{row.flags[0]}: "):
            _plan(*_context_flags(row), row.flags[0], str(value))
    _write(home, _file_with(row, value))
    with pytest.raises(NotBuiltError) as caught:
        _plan()
    assert str(caught.value).endswith(row.refusal(value))


def test_an_accelerate_file_with_default_tpu_keys_and_empty_blocks_loads(home):
    # `accelerate config` writes these defaults into every file; they ask for nothing, so nothing is refused.
    path = _write(home, {"distributed_type": "NO", "downcast_bf16": "no", "tpu_env": [], "tpu_use_cluster": False,
                         "tpu_use_sudo": False, "main_training_function": "main", "deepspeed_config": {},
                         "fp8_config": {}, "megatron_lm_config": {}, "parallelism_config": {}, "mpirun_config": {}})
    assert config_file.load_config_file(path)["distributed_type"] == "NO"
    assert _plan().num_processes == 1


def test_every_flag_row_is_in_the_launch_parser_under_both_spellings():
    parser = launch_command_parser()
    options = {option for action in parser._actions for option in action.option_strings}
    for row in table.SETTINGS:
        for flag in row.flags:
            assert flag in options, flag
            if flag.startswith("--") and "_" in flag:
                assert flag.replace("_", "-") in options


def test_one_boolean_and_one_integer_parser():
    import pathlib
    import re

    import hasten

    root = pathlib.Path(hasten.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        text = path.read_text()
        if path.name == "environment.py" and path.parent == root:
            continue
        for pattern in (r"in \(\s*\"true\", \"false\"", r"in \(\"1\", \"true\"", r"\.lower\(\) == \"true\"",
                        r"(?<!\w)int\(os\.environ", r"(?<!\w)int\(env\[", r"def _(?:positive|non_negative)_int", r"def _int_at_least",
                        r"def _parse_bool", r"def _bool_text"):
            if re.search(pattern, text):
                offenders.append(f"{path.relative_to(root)}: {pattern}")
    assert not offenders, offenders


# -- explain reports what the launched script's Accelerator uses ---------------------------------------------------

# Per round: setting -> (source, value). Each setting comes from a different source in each round; the second round
# also has code beating the environment (dynamo_backend) and runs one process in place instead of two under torchrun.
ROUNDS = [
    (2, {"mixed_precision": ("flag", "bf16"), "dynamo_backend": ("environment", "eager"),
         "dynamo_mode": ("file", "reduce-overhead"), "debug": ("file", True), "gradient_accumulation_steps": ("code", 3)}),
    (1, {"mixed_precision": ("file", "fp16"), "dynamo_backend": ("code", "aot_eager"),
         "dynamo_mode": ("environment", "max-autotune"), "debug": ("environment", True),
         "gradient_accumulation_steps": ("flag", 2)}),
]


def _as_text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


@pytest.mark.parametrize("processes,round_", ROUNDS, ids=["two processes", "one process"])
def test_explain_reports_what_the_launched_scripts_accelerator_uses(processes, round_, home, monkeypatch, capsys):
    import json
    import os
    import subprocess
    import sys

    from hasten.commands import config as config_command
    from launching import SCRIPTS

    flags, env, file_values, code = ["--cpu", "--num_processes", str(processes)], {}, {"distributed_type": "MULTI_CPU"}, {}
    for name, (source, value) in round_.items():
        row = table.get(name)
        if source == "flag":
            flags += [row.flags[0], str(value)]
        elif source == "environment":
            env[row.env[0]] = _as_text(value)
        elif source == "file":
            file_values.update(_file_with(row, value))
        else:
            code[name] = value
    if round_["dynamo_backend"][0] == "code":
        env["HASTEN_DYNAMO_BACKEND"] = "eager"  # the code's value must win over this
    flags += ["--config_file", _write(home, file_values)]  # named: --cpu alone skips the default file, as Accelerate

    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("HASTEN_", "ACCELERATE_"))}
    full_env.update(env, PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "hasten", "launch", *flags, str(SCRIPTS / "settings_report.py"), json.dumps(code)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, env=full_env)
    assert result.returncode == 0, result.stderr
    lines = {line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1]) for line in result.stdout.splitlines()
             if line.startswith(("USED ", "EXPLAINED "))}
    used, in_script = lines["USED"], lines["EXPLAINED"]

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    assert config_command.main(["explain", "--all", *flags]) == 0
    out = capsys.readouterr().out
    explained = {line.split()[0]: line.split()[1:3] for line in out.splitlines()[3:] if len(line.split()) >= 3}

    for name, (source, value) in round_.items():
        assert _as_text(used[name]) == _as_text(value), f"{name}: the script used {used[name]!r}, not {value!r}"
        assert in_script[name] == [value, source], f"{name}: in-script explain says {in_script[name]}"
        if source != "code":  # code is known only inside the script
            assert explained[name] == [_as_text(used[name]), source], f"{name}: explain says {explained[name]}"
    assert used["use_cpu"] is True and explained["use_cpu"] == ["true", "flag"]


def test_docs_settings_page_is_generated_from_the_table():
    import importlib.util

    script = REPO / "scripts" / "settings_doc.py"
    spec = importlib.util.spec_from_file_location("settings_doc", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.PAGE.read_text() == module.render(), "docs/settings.md is stale: run python scripts/settings_doc.py"


# The TPU and SageMaker rows that only Accelerate's own launchers set: each route a row has (flag, file key,
# variable) is refused in one line that names the row's feature.
LAUNCHER_ONLY_UNBUILT = ("vm", "tpu_vm",
                         "aws_access_key_id", "aws_secret_access_key", "use_sagemaker", "sagemaker_distributed_type")


@pytest.mark.parametrize("name", LAUNCHER_ONLY_UNBUILT)
def test_tpu_and_sagemaker_rows_are_refused_by_each_route_they_have(name, home, monkeypatch):
    row = table.BY_NAME[name]
    assert not row.built
    routes = 0
    if row.flags:
        argv = [row.flags[0]] if row.switch else [row.flags[0], str(_sample(row))]
        with pytest.raises(NotBuiltError, match="is not built in hasten yet; fix: ") as caught:
            _plan(*argv)
        assert str(caught.value).startswith(row.flags[0]) and "\n" not in str(caught.value)
        routes += 1
    if row.file_key:
        _write(home, _sample_file(row))
        with pytest.raises(NotBuiltError, match="is not built in hasten yet; fix: ") as caught:
            _plan()
        assert "\n" not in str(caught.value)
        routes += 1
    if row.env:
        monkeypatch.setenv(row.env[-1], str(_sample(row)))
        with pytest.raises(NotBuiltError, match=f"environment variable {row.env[-1]}=") as caught:
            Accelerator()
        assert str(caught.value).endswith(row.refusal())
        routes += 1
    assert routes, f"{name} has no flag, file key or variable"


@pytest.mark.parametrize("variable, value, words", [
    ("ACCELERATE_ALLOW_CP_STANDALONE", "true", "context parallelism without FSDP"),
])
def test_rows_hasten_does_not_read_are_refused_naming_what_they_are(variable, value, words):
    """An Accelerate variable with no effect in hasten is refused in one line that names the feature (not another
    one) and the fix."""
    from hasten.config.settings import refuse_unbuilt_environment
    from hasten.core.errors import NotBuiltError

    with pytest.raises(NotBuiltError, match=words) as caught:
        refuse_unbuilt_environment({variable: value})
    assert "fix: unset it" in str(caught.value) and "\n" not in str(caught.value)


# Rows read by several variable names (HASTEN_X, ACCELERATE_X): each name alone must be read. Left out: rows whose
# value nothing reads through the table (NOT_YET_PROVEN in tests/acceptance_map.py says why), so that reaching
# the table would prove nothing.
SPELLINGS = [(row, variable) for row in table.SETTINGS if len(row.env) > 1
             and f"setting:{row.name}" not in ("setting:enable_rich", "setting:in_tpu_pod") for variable in row.env]


def _other_than_default(row) -> str:
    """A valid value of `row`, as a variable's text, that is not its default."""
    if row.kind == "bool":
        return "false" if row.default is True else "true"
    if row.choices:
        return str([c for c in row.allowed() if c != row.default and c not in row.unbuilt_values][-1])
    if row.kind == "int":
        return str(max(row.default or 0, int(row.minimum or 0)) + 1)
    return {"float": "1.5"}.get(row.kind, "x")


@pytest.mark.parametrize("row, variable", SPELLINGS, ids=[variable for _, variable in SPELLINGS])
def test_each_spelling_of_a_variable_is_read_alone(row, variable, monkeypatch):
    """`python scripts/prove_honoured.py --kind spelling` hides one name at a time: the value each name gives alone
    is the one the processes use (a row not built: each name alone is refused in one line)."""
    from hasten.config.resolve import runtime_value

    for name in (*row.env, "HASTEN_CONFIG_SOURCES"):
        monkeypatch.delenv(name, raising=False)
    text = _other_than_default(row)
    monkeypatch.setenv(variable, text)
    if not row.built:
        with pytest.raises(NotBuiltError, match=f"^environment variable {variable}="):
            Accelerator()
        return
    resolved = runtime_value(row.name)
    assert (resolved.value, resolved.source, resolved.origin) == (row.convert(text), "environment", variable)
