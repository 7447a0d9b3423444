"""The run plan (plan/rules.py): one function decides backend, distributed type, plugins, mesh, precision and
accumulation; `Accelerator` hands it on; `hasten config explain --plan` prints it; no other module decides again."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
from pathlib import Path

import pytest
import torch

from hasten.plan import Cluster, RunPlan, make_run_plan
from hasten.core.enums import DistributedType
from hasten.core.errors import ConfigError
from hasten.parallelism_config import ParallelismConfig

SRC = Path(__file__).resolve().parents[2] / "src" / "hasten"
PLAN = "plan/"  # every module of the plan package decides; nothing outside it does


def _cluster(processes=2, distributed_type=DistributedType.MULTI_CPU, device_type="cpu"):
    return lambda _fsdp_plugin=None: Cluster(processes, device_type, distributed_type)


def _fsdp(**kwargs):
    from hasten.config.fsdp import FullyShardedDataParallelPlugin

    return FullyShardedDataParallelPlugin(**kwargs)


def _deepspeed(tmp_path, name="ds", **config):
    from hasten.config.deepspeed import DeepSpeedPlugin

    path = tmp_path / f"{name}.json"
    config.setdefault("zero_optimization", {"stage": 2})
    path.write_text(json.dumps({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", **config}))
    return DeepSpeedPlugin(hf_ds_config=str(path))


# -- layouts -> backend, distributed type, plugins ------------------------------------------------------------------

def test_ddp_and_single_process_plans():
    plan = make_run_plan(cluster=_cluster(2))
    assert (plan.backend, plan.distributed_type, plan.num_processes) == ("ddp", DistributedType.MULTI_CPU, 2)
    assert plan.fsdp_plugin is None and plan.deepspeed_plugins is None and plan.megatron_lm_plugin is None
    assert plan.mesh == () and plan.parallelism_config is None
    assert (plan.precision.setting, plan.precision.source, plan.precision.trains_in) == ("no", "default", "no")
    assert (plan.accumulation.steps, plan.accumulation.source) == (1, "default")
    assert make_run_plan(cluster=_cluster(1, DistributedType.NO)).backend == "single"


def test_fsdp_plan_from_code_and_from_the_launcher(monkeypatch):
    plugin = _fsdp(fsdp_version=2)
    plan = make_run_plan(cluster=_cluster(2), fsdp_plugin=plugin, mixed_precision="bf16")
    assert (plan.backend, plan.distributed_type) == ("fsdp", DistributedType.FSDP)
    assert plan.fsdp_plugin is plugin
    assert (plan.precision.setting, plan.precision.source) == ("bf16", "Accelerator(mixed_precision=...)")
    monkeypatch.setenv("HASTEN_USE_FSDP", "true")
    monkeypatch.setenv("HASTEN_MIXED_PRECISION", "fp16")
    plan = make_run_plan(cluster=_cluster(1, DistributedType.NO))  # FSDP also runs in one process
    assert (plan.backend, plan.distributed_type) == ("fsdp", DistributedType.FSDP)
    assert plan.fsdp_plugin is not None and plan.precision.setting == "fp16"
    assert "HASTEN_MIXED_PRECISION" in plan.precision.source


def test_deepspeed_plan_takes_precision_and_accumulation_into_the_plugins(tmp_path):
    first = _deepspeed(tmp_path, "a", gradient_accumulation_steps=4, zero_optimization={"stage": 2})
    second = _deepspeed(tmp_path, "b", zero_optimization={"stage": 3})
    plan = make_run_plan(cluster=_cluster(2), deepspeed_plugins={"a": first, "b": second}, mixed_precision="bf16")
    assert (plan.backend, plan.distributed_type) == ("deepspeed", DistributedType.DEEPSPEED)
    assert plan.deepspeed_plugin is first and list(plan.deepspeed_plugins) == ["a", "b"]
    assert first.deepspeed_config["bf16"]["enabled"] is True and second.deepspeed_config["bf16"]["enabled"] is True
    assert plan.precision.trains_in == "bf16"
    # the config's count stands when the script left the default, and the plan says where it came from
    assert (plan.accumulation.steps, plan.accumulation.source) == (4, "the DeepSpeed config")
    assert plan.accumulation.plugin.num_steps == 4


def test_deepspeed_config_precision_is_what_the_run_trains_in(tmp_path):
    plugin = _deepspeed(tmp_path, bf16={"enabled": True})
    plan = make_run_plan(cluster=_cluster(2), deepspeed_plugin=plugin)
    assert (plan.precision.setting, plan.precision.trains_in) == ("no", "bf16")
    assert "trains in bf16 (the DeepSpeed config)" in "\n".join(plan.describe())


def test_tensor_parallel_layouts():
    plan = make_run_plan(cluster=_cluster(2), parallelism_config=ParallelismConfig(tp_size=2))
    assert (plan.backend, plan.distributed_type, plan.fsdp_plugin) == ("tensor_parallel", DistributedType.MULTI_CPU, None)
    assert plan.mesh == (("tp", 2),)
    plan = make_run_plan(cluster=_cluster(4), parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2))
    assert (plan.backend, plan.distributed_type) == ("tensor_parallel", DistributedType.FSDP)
    assert plan.fsdp_plugin.fsdp_version == 2 and plan.mesh == (("dp_shard", 2), ("tp", 2))


def test_data_parallel_and_pipeline_layouts():
    plan = make_run_plan(cluster=_cluster(2), parallelism_config=ParallelismConfig(dp_shard_size=2))
    assert (plan.backend, plan.distributed_type, plan.fsdp_plugin.fsdp_version) == ("fsdp", DistributedType.FSDP, 2)
    plan = make_run_plan(cluster=_cluster(2), parallelism_config=ParallelismConfig(dp_replicate_size=2))
    assert (plan.backend, plan.fsdp_plugin) == ("ddp", None)
    plan = make_run_plan(cluster=_cluster(2), parallelism_config=ParallelismConfig(pp_size=2))
    assert (plan.backend, plan.distributed_type, plan.mesh) == ("pipeline", DistributedType.MULTI_CPU, (("pp", 2),))
    with pytest.raises(ConfigError, match="does not compose with dp_shard_size"):
        make_run_plan(cluster=_cluster(2), parallelism_config=ParallelismConfig(dp_shard_size=2),
                      deepspeed_plugin=_deepspeed_stub())


def _deepspeed_stub():
    from hasten.config.deepspeed import DeepSpeedPlugin

    return DeepSpeedPlugin()


def test_megatron_plan_is_a_native_layout():
    from hasten.config.megatron import MegatronLMPlugin

    plan = make_run_plan(cluster=_cluster(4), megatron_lm_plugin=MegatronLMPlugin(tp_degree=2, pp_degree=2))
    assert (plan.backend, plan.mesh) == ("pipeline", (("pp", 2), ("tp", 2)))
    plan = make_run_plan(cluster=_cluster(2),
                         megatron_lm_plugin=MegatronLMPlugin(tp_degree=2, recompute_activations=True))
    assert plan.backend == "tensor_parallel" and plan.fsdp_plugin.activation_checkpointing is True
    with pytest.raises(ConfigError, match="both a Megatron-LM plugin and fsdp_plugin"):
        make_run_plan(cluster=_cluster(2), megatron_lm_plugin=MegatronLMPlugin(tp_degree=2), fsdp_plugin=_fsdp())


def test_accumulation_in_the_plan():
    from hasten.config.handlers import GradientAccumulationPlugin

    plan = make_run_plan(cluster=_cluster(2), gradient_accumulation_steps=3)
    assert (plan.accumulation.steps, plan.accumulation.source) == (3, "Accelerator(gradient_accumulation_steps=...)")
    given = GradientAccumulationPlugin(num_steps=5, sync_each_batch=True)
    plan = make_run_plan(cluster=_cluster(2), gradient_accumulation_plugin=given)
    assert plan.accumulation.plugin is given and plan.accumulation.steps == 5
    with pytest.raises(ConfigError, match="not both"):
        make_run_plan(cluster=_cluster(2), gradient_accumulation_steps=2, gradient_accumulation_plugin=given)


def test_the_plan_leaves_the_users_accumulation_plugin_as_given(tmp_path):
    from hasten.config.handlers import GradientAccumulationPlugin

    given = GradientAccumulationPlugin(num_steps=1, sync_each_batch=True)
    plan = make_run_plan(cluster=_cluster(2), deepspeed_plugin=_deepspeed(tmp_path, gradient_accumulation_steps=4),
                         gradient_accumulation_plugin=given)
    assert (plan.accumulation.steps, plan.accumulation.plugin.num_steps) == (4, 4)  # DeepSpeed's count, in a copy
    assert plan.accumulation.plugin.sync_each_batch and given.num_steps == 1


def test_the_cluster_is_asked_only_after_the_arguments_are_checked():
    def never():
        raise AssertionError("the cluster was detected before the arguments were checked")

    with pytest.raises(TypeError, match="fsdp_plugin must be a FullyShardedDataParallelPlugin"):
        make_run_plan(cluster=never, fsdp_plugin="fsdp")
    with pytest.raises(ConfigError, match="dynamo_backend or dynamo_plugin"):
        from hasten.config.handlers import TorchDynamoPlugin

        make_run_plan(cluster=never, dynamo_backend="inductor", dynamo_plugin=TorchDynamoPlugin())


def test_the_plan_is_frozen_and_slotted():
    plan = make_run_plan(cluster=_cluster(2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.backend = "fsdp"
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.precision.setting = "bf16"
    assert not hasattr(plan, "__dict__")


# -- the Accelerator hands the plan on --------------------------------------------------------------------------------

def test_accelerator_runs_the_plan_it_made():
    from hasten import Accelerator

    accelerator = Accelerator(cpu=True, fsdp_plugin=_fsdp(fsdp_version=2), mixed_precision="bf16",
                              gradient_accumulation_steps=2)
    plan = accelerator.run_plan
    assert isinstance(plan, RunPlan) and not plan.settled
    assert accelerator.distributed_type == plan.distributed_type == DistributedType.FSDP
    assert accelerator.state.fsdp_plugin is plan.fsdp_plugin and accelerator._backend.name == plan.backend == "fsdp"
    assert accelerator.mixed_precision == plan.precision.trains_in == "bf16"
    assert accelerator.gradient_accumulation_steps == plan.accumulation.steps == 2


def test_a_second_accelerator_keeps_the_run_the_first_one_decided():
    from hasten import Accelerator

    Accelerator(cpu=True)
    second = Accelerator(cpu=True, fsdp_plugin=_fsdp())  # as Accelerate: the state made first stands
    assert second.run_plan.settled and second.distributed_type == DistributedType.NO
    assert second.run_plan.backend == "single"


def test_a_second_accelerator_lays_out_and_compiles_as_the_first_one_did():
    """Accelerate's state keeps the first Accelerator's ParallelismConfig and dynamo plugin, and a second
    Accelerator reads its layout from there: its plan (what its backend is built from) must carry the same ones, or
    its backend would lay the model out for a layout the state does not have."""
    from types import SimpleNamespace

    from hasten.config.handlers import TorchDynamoPlugin

    layout, dynamo, fsdp = ParallelismConfig(dp_shard_size=2), TorchDynamoPlugin(backend="inductor"), _fsdp(fsdp_version=2)
    first = SimpleNamespace(parallelism_config=layout, dynamo_plugin=dynamo, fsdp_plugin=fsdp, deepspeed_plugins=None,
                            deepspeed_plugin=None, distributed_type=DistributedType.FSDP, _mixed_precision="no",
                            mixed_precision="no")
    cluster = lambda _fsdp_plugin=None: Cluster(2, "cpu", DistributedType.MULTI_CPU, first)  # noqa: E731
    plan = make_run_plan(cluster=cluster, dynamo_backend="no")
    assert plan.settled and plan.parallelism_config is layout and plan.dynamo_plugin is dynamo
    assert plan.backend == "fsdp" and plan.fsdp_plugin is fsdp and plan.mesh == (("dp_shard", 2),)
    # a layout given to the second one does not replace the state's (Accelerate ignores it too)
    plan = make_run_plan(cluster=cluster, parallelism_config=ParallelismConfig(dp_replicate_size=2))
    assert plan.parallelism_config is layout and plan.backend == "fsdp"


def test_a_hand_built_accelerator_state_keeps_accelerates_constructor():
    from hasten.state import AcceleratorState, PartialState

    plugin = _fsdp(fsdp_version=2)
    state = AcceleratorState(fsdp_plugin=plugin, mixed_precision="bf16", cpu=True, _from_accelerator=True)
    assert state.distributed_type == PartialState().distributed_type == DistributedType.FSDP
    # the same plan rules an Accelerator's state follows: the plugin's policy is filled from the precision
    assert state.mixed_precision == "bf16" and plugin.mixed_precision_policy.param_dtype == torch.bfloat16


def test_accelerator_init_is_short():
    from hasten.accelerator import Accelerator

    lines, _ = inspect.getsourcelines(Accelerator.__init__)
    assert len(lines) <= 50, f"Accelerator.__init__ has {len(lines)} lines; make the plan and hand it on"


# -- config explain --plan --------------------------------------------------------------------------------------------

def test_config_explain_prints_the_plan(capsys, tmp_path, monkeypatch):
    from hasten.commands import cli

    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert cli.main(["config", "explain", "--plan", "--num_processes", "4", "--parallelism_config_dp_shard_size", "2",
                     "--parallelism_config_tp_size", "2", "--mixed_precision", "bf16",
                     "--gradient_accumulation_steps", "3"]) == 0
    out = capsys.readouterr().out
    section = out[out.index("run plan"):].splitlines()
    assert "  backend: tensor_parallel" in section and "  distributed type: FSDP" in section
    assert "  fsdp plugin: FSDP2, reshard_after_forward=True" in section
    assert "  mesh: dp_shard=2 x tp=2" in section
    assert "  precision: bf16 (from --mixed_precision)" in section
    assert "  accumulation: 3 step(s) (from --gradient_accumulation_steps)" in section
    assert "  processes: 4 on cpu" in section
    assert cli.main(["config", "explain", "--num_processes", "2", "--cpu"]) == 0
    assert "run plan" not in capsys.readouterr().out  # only when asked


def test_the_plan_names_the_fp8_engine_and_explain_prints_it(capsys, tmp_path, monkeypatch):
    from hasten.commands import cli
    from hasten.config.fp8 import AORecipeKwargs, TERecipeKwargs
    from hasten.plan import make_run_plan

    monkeypatch.setenv("HF_HOME", str(tmp_path))
    cluster = _cluster(1, DistributedType.NO)
    assert make_run_plan(cluster=cluster).precision.fp8_engine is None  # not an fp8 run
    # the recipe handler's library decides, then the fp8_backend setting, then what is installed (torchao first)
    assert make_run_plan(cluster=cluster, mixed_precision="fp8", fp8_handler=TERecipeKwargs()).precision.fp8_engine == "TE"
    assert make_run_plan(cluster=cluster, mixed_precision="fp8", fp8_handler=AORecipeKwargs()).precision.fp8_engine == "AO"
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "TE")
    assert make_run_plan(cluster=cluster, mixed_precision="fp8").precision.fp8_engine == "TE"
    monkeypatch.delenv("ACCELERATE_FP8_BACKEND")
    assert cli.main(["config", "explain", "--plan", "--num_processes", "1", "--cpu", "--mixed_precision", "fp8",
                     "--fp8_backend", "te"]) == 0
    out = capsys.readouterr().out
    assert "  precision: fp8 (from --mixed_precision), fp8 engine Transformer Engine" in out.splitlines()


# -- nobody else decides ----------------------------------------------------------------------------------------------

PLUGIN_CLASSES = {"FullyShardedDataParallelPlugin", "DeepSpeedPlugin", "MegatronLMPlugin", "TorchDynamoPlugin",
                  "GradientAccumulationPlugin"}
# Where else a plugin object is made, and why that chooses nothing about the run (the run's choice is the plan's).
CONSTRUCTION_EXCEPTIONS = {}  # none: every backend is built from the plan, defaults included
# Where else DistributedType.FSDP/DEEPSPEED is set, and why (nowhere: a hand-built AcceleratorState makes a plan too).
TYPE_EXCEPTIONS = {}
# Rules that live beside their data and that only the plan may call.
PLAN_ONLY_CALLS = {"backend_for_layout", "config_for_run", "backend_to_build", "fp8_engine"}


def _sources():
    for path in sorted(SRC.rglob("*.py")):
        yield path.relative_to(SRC).as_posix(), ast.parse(path.read_text(), filename=str(path))


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _names_the_plan(node) -> bool:
    """`plan` or `self.run_plan`: the backend is built from the whole plan, never from a name chosen elsewhere."""
    return (isinstance(node, ast.Name) and node.id == "plan") or (isinstance(node, ast.Attribute)
                                                                  and node.attr == "run_plan")


def _chooses_a_type(node: ast.Attribute, parents: dict) -> bool:
    """`DistributedType.FSDP` used other than in a comparison (`==`, `in (...)`): assigned, returned, mapped."""
    if not (isinstance(node.value, ast.Name) and node.value.id == "DistributedType" and node.attr in
            ("FSDP", "DEEPSPEED")):
        return False
    parent = parents.get(node)
    while isinstance(parent, (ast.Tuple, ast.List, ast.Set)):
        parent = parents.get(parent)
    return not isinstance(parent, ast.Compare)


def test_one_function_makes_the_plan_and_no_other_module_chooses_a_backend_or_plugin():
    found = []
    for module, tree in _sources():
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _chooses_a_type(node, parents):
                if not module.startswith(PLAN) and module not in TYPE_EXCEPTIONS:
                    found.append(f"{module}:{node.lineno}: sets DistributedType.{node.attr}")
            if not isinstance(node, ast.Call):
                continue
            name = _called_name(node)
            if name in PLUGIN_CLASSES and not module.startswith(PLAN) and (module, name) not in CONSTRUCTION_EXCEPTIONS:
                found.append(f"{module}:{node.lineno}: makes a {name}")
            if name == "create_backend" and not (node.args and _names_the_plan(node.args[0])):
                found.append(f"{module}:{node.lineno}: create_backend is given something other than the run plan")
            if name in PLAN_ONLY_CALLS and not module.startswith(PLAN):
                found.append(f"{module}:{node.lineno}: calls {name}, a rule only make_run_plan applies")
    assert not found, "decided outside the plan (hasten/plan/):\n" + "\n".join(found)


def test_no_module_but_the_policy_itself_makes_a_precision_policy():
    """The precision policy is made from the plan's precision (its fp8 engine included): by the Accelerator
    (`PrecisionPolicy.from_setting` with the script's handlers) or, for a backend built without one,
    `PrecisionPolicy.from_plan`. A backend whose engine casts narrows that policy (`applied_by_engine`); none makes
    its own (the DeepSpeed backend's dropped the plan's fp8 recipe)."""
    found = [f"{module}:{node.lineno}" for module, tree in _sources() for node in ast.walk(tree)
             if isinstance(node, ast.Call) and _called_name(node) == "PrecisionPolicy"
             and module != "training/precision.py"]
    assert not found, "a PrecisionPolicy made outside the plan's precision:\n" + "\n".join(found)


def test_a_backend_built_without_a_policy_takes_the_plans_precision():
    from types import SimpleNamespace

    from hasten.backends.single import SingleBackend

    plan = make_run_plan(cluster=_cluster(1, DistributedType.NO), mixed_precision="bf16")
    backend = SingleBackend(SimpleNamespace(device=torch.device("cpu")), plan)
    assert backend.precision.mode == "bf16" and backend.precision.native_amp


def test_the_exceptions_are_still_needed():
    """A named exception that no longer matches anything is removed, so the list stays the truth."""
    seen_types, seen_constructions = set(), set()
    for module, tree in _sources():
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _chooses_a_type(node, parents):
                seen_types.add(module)
            if isinstance(node, ast.Call) and _called_name(node) in PLUGIN_CLASSES:
                seen_constructions.add((module, _called_name(node)))
    assert set(TYPE_EXCEPTIONS) <= seen_types and set(CONSTRUCTION_EXCEPTIONS) <= seen_constructions
    plan_calls = [
        _called_name(node) for path in sorted((SRC / PLAN).glob("*.py")) for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
    ]
    assert PLAN_ONLY_CALLS <= set(plan_calls)
    assert plan_calls.count("make_run_plan") == 0  # one maker; its callers are the Accelerator and config explain


# What the plan decides, which a backend or a layout step must read from the plan it was built with, never from the
# shared state (a second Accelerator's state and plan agree only because the plan copies the state's, `settled`).
PLAN_SETTINGS = {"parallelism_config", "dynamo_plugin", "fsdp_plugin", "deepspeed_plugin", "deepspeed_plugins",
                 "megatron_lm_plugin", "mixed_precision", "_mixed_precision", "distributed_type"}


def _is_state(node) -> bool:
    """`state` or `self.state` (or `self._state`)."""
    return (isinstance(node, ast.Name) and node.id == "state") or (
        isinstance(node, ast.Attribute) and node.attr in ("state", "_state"))


def test_backends_and_layout_steps_read_the_plan_not_the_state():
    found = []
    for module, tree in _sources():
        # fsdp/functions.py is Accelerate's `fsdp_utils`: public functions given an accelerator, which read its state
        if not module.startswith(("backends/", "parallelize/")) or module == "backends/fsdp/functions.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in PLAN_SETTINGS and _is_state(node.value):
                found.append(f"{module}:{node.lineno}: reads state.{node.attr}")
            if (isinstance(node, ast.Call) and _called_name(node) == "getattr" and len(node.args) >= 2
                    and _is_state(node.args[0]) and isinstance(node.args[1], ast.Constant)
                    and node.args[1].value in PLAN_SETTINGS):
                found.append(f"{module}:{node.lineno}: reads getattr(state, {node.args[1].value!r})")
    assert not found, "a backend reads a planned setting from the state, not its plan:\n" + "\n".join(found)
