"""The run plan: which backend, distributed type, plugins, mesh layout, precision and accumulation a run gets.

`make_run_plan` decides all of it once, from what `Accelerator(...)` was given, the resolved settings (launcher
flags, config file, environment: hasten.config.resolve) and the detected cluster, before anything is built. The
result is one frozen `RunPlan`; `AcceleratorState`, the backend registry (`create_backend(plan, state, ...)`), the
precision policy and `GradientState` read it and decide nothing again. `hasten config explain --plan` prints the
plan the same function makes from the launch settings alone.

Adding a backend: a rule in `plan/layout.backend_to_build` (and, if it needs one, a plugin step below), a line in
`REGISTRY` (backends/__init__.py) and its folder. Adding a layout dimension: `plan/layout.backend_for_layout`
refuses it or names the backend it needs; a backend that runs whatever the distributed type says joins
`LAYOUT_BACKENDS` (plan/layout.py). The order of the steps is the order in which Accelerate checks its arguments,
so the first error a script sees is the one it saw before the plan existed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ..core.enums import DistributedType
from ..core.errors import ConfigError, NotSupportedYetError
from .layout import backend_to_build

@dataclass(frozen=True, slots=True)
class Cluster:
    """What the plan needs to know about the processes. In a run: `PartialState`'s answer (the process group is
    joined when the plan first asks), plus the `AcceleratorState` an earlier Accelerator of this process left
    (`settled`): the run is then already decided and that state keeps it, as in Accelerate."""

    num_processes: int
    device_type: str
    distributed_type: DistributedType
    settled: Any = None


@dataclass(frozen=True, slots=True)
class Precision:
    setting: str  # the resolved mixed_precision setting: "no", "fp16", "bf16" or "fp8"
    source: str  # where the setting came from
    trains_in: str  # what the run computes in: the setting, or the active DeepSpeed config's own choice
    fp8_engine: str | None = None  # fp8 runs: "AO" (torchao) or "TE" (Transformer Engine), plan/precision.py


@dataclass(frozen=True, slots=True)
class Accumulation:
    steps: int | None
    source: str
    plugin: Any  # the GradientAccumulationPlugin GradientState is given


@dataclass(frozen=True, slots=True)
class RunPlan:
    """The run's setup, decided once (see the module docstring). Frozen: a field cannot be replaced; the plugin
    objects inside are the user's own and keep their methods (e.g. `select_deepspeed_plugin`)."""

    backend: str
    distributed_type: DistributedType
    num_processes: int
    device_type: str
    fsdp_plugin: Any
    deepspeed_plugins: dict | None
    megatron_lm_plugin: Any
    dynamo_plugin: Any
    parallelism_config: Any
    precision: Precision
    accumulation: Accumulation
    settled: bool = field(default=False)  # an earlier Accelerator's state decides (see Cluster.settled)
    # FSDP2's settings for a tensor/pipeline layout without data-parallel dimensions (activation checkpointing, the
    # precision policy): such a run is not FSDP, so `fsdp_plugin` stays None, as Accelerate's state has it
    layout_fsdp_plugin: Any = None

    @property
    def sharding_plugin(self):
        """The FSDP plugin the backend shards (or lays out) the model with: the run's, else the layout's; None."""
        return self.fsdp_plugin if self.fsdp_plugin is not None else self.layout_fsdp_plugin

    @property
    def deepspeed_plugin(self):
        """The selected DeepSpeed plugin (the one the next prepare() builds its engine with), or None."""
        return _selected(self.deepspeed_plugins)

    @property
    def mesh(self) -> tuple:
        """((dimension, size), ...) of the mesh the run builds, outermost first; () without a ParallelismConfig."""
        config = self.parallelism_config
        if config is None:
            return ()
        return tuple((dim, config._sizes[dim]) for dim in config.active_mesh_dims)

    def describe(self) -> list:
        """The plan as lines of text (`hasten config explain --plan`)."""
        mesh = " x ".join(f"{dim}={size}" for dim, size in self.mesh) or "none (no ParallelismConfig)"
        deepspeed = "none"
        if self.deepspeed_plugins:
            deepspeed = ", ".join(f"{name}: ZeRO stage {p.zero_stage}" + (" (selected)" if p.selected else "")
                                  for name, p in self.deepspeed_plugins.items())
        fsdp = "none" if self.fsdp_plugin is None else _fsdp_line(self.fsdp_plugin)
        megatron = "none" if self.megatron_lm_plugin is None else (
            f"tp_degree={self.megatron_lm_plugin.tp_degree}, pp_degree={self.megatron_lm_plugin.pp_degree}")
        precision = self.precision
        trains = "" if precision.trains_in == precision.setting else (
            f", trains in {precision.trains_in} (the DeepSpeed config)")
        if precision.fp8_engine is not None:
            trains += f", fp8 engine {_FP8_ENGINES[precision.fp8_engine]}"
        return [
            f"backend: {self.backend}",
            f"distributed type: {self.distributed_type.value}",
            f"processes: {self.num_processes} on {self.device_type}",
            f"fsdp plugin: {fsdp}",
            f"deepspeed plugins: {deepspeed}",
            f"megatron-lm plugin: {megatron}",
            f"dynamo: {_name(self.dynamo_plugin.backend)}",
            f"mesh: {mesh}",
            f"precision: {precision.setting} (from {precision.source}){trains}",
            f"accumulation: {self.accumulation.steps} step(s) (from {self.accumulation.source})",
        ]


_FP8_ENGINES = {"AO": "torchao", "TE": "Transformer Engine"}


def _name(value) -> str:
    return str(getattr(value, "name", value))


def _fsdp_line(plugin) -> str:
    if plugin.fsdp_version == 2:
        words = [f"FSDP2, reshard_after_forward={plugin.reshard_after_forward}"]
    else:
        words = [f"FSDP1, {_name(plugin.sharding_strategy)}"]
    offload = plugin.cpu_offload  # FSDP1: CPUOffload(offload_params=...); FSDP2: CPUOffloadPolicy when on
    if getattr(offload, "offload_params", type(offload).__name__ == "CPUOffloadPolicy"):
        words.append("cpu offload")
    if plugin.activation_checkpointing:
        words.append("activation checkpointing")
    return ", ".join(words)


def make_run_plan(*, cluster: Callable[[Any], Cluster], mixed_precision=None, gradient_accumulation_steps: int = 1,
                  gradient_accumulation_plugin=None, deepspeed_plugin=None, deepspeed_plugins=None, fsdp_plugin=None,
                  torch_tp_plugin=None, megatron_lm_plugin=None, dynamo_backend=None, dynamo_plugin=None,
                  parallelism_config=None, fp8_handler=None, earlier_deepspeed: bool = False,
                  plan_accumulation: bool = True) -> RunPlan:
    """The run plan for `Accelerator(...)`'s arguments of the same names. `cluster(fsdp_plugin)` is called when the
    plan first needs the processes (in a run, that joins the process group), so argument errors come first; it is
    handed the FSDP plugin known at that point, whose offload decides the default group's backend. `fp8_handler`:
    the fp8 recipe kwargs handler the Accelerator was given (its library is the fp8 engine). `earlier_deepspeed`: an
    earlier Accelerator of this process holds DeepSpeed plugins (a second one may not bring its own).
    `plan_accumulation=False`: the plan of a hand-built `AcceleratorState`, which has no accumulation to agree with
    DeepSpeed's config (the Accelerator made over it plans that)."""
    from ..config.handlers import TorchDynamoPlugin
    from .layout import config_for_run

    if dynamo_backend is not None and dynamo_plugin is not None:
        raise ConfigError("pass either dynamo_backend or dynamo_plugin to Accelerator, not both")
    dynamo_plugin = dynamo_plugin or TorchDynamoPlugin(backend=dynamo_backend)
    fsdp_plugin = _fsdp_plugin(fsdp_plugin)
    deepspeed_plugins = _deepspeed_plugins(deepspeed_plugin, deepspeed_plugins, fsdp_plugin, earlier_deepspeed)
    megatron_lm_plugin = _megatron_plugin(megatron_lm_plugin)  # served by TP/PP/FSDP (config/megatron.py)
    if megatron_lm_plugin is not None:
        parallelism_config, fsdp_plugin = _megatron_layout(megatron_lm_plugin, cluster(fsdp_plugin).num_processes,
                                                           parallelism_config, fsdp_plugin, deepspeed_plugins,
                                                           torch_tp_plugin)
    parallelism_config = config_for_run(parallelism_config, torch_tp_plugin)
    layout = None
    if parallelism_config is not None:  # the layout picks the backend: dp_shard -> FSDP2, dp_replicate -> DDP
        layout, fsdp_plugin = _layout(parallelism_config, cluster(fsdp_plugin), fsdp_plugin, deepspeed_plugins)
    processes = cluster(fsdp_plugin)
    settled = processes.settled
    if settled is not None and settled.parallelism_config is not parallelism_config:
        # The earlier Accelerator's layout and compile settings stay the run's (Accelerate's state keeps them, and a
        # second Accelerator reads its layout from there): the backend is built for that layout.
        parallelism_config = settled.parallelism_config
        layout = None if parallelism_config is None else _layout(
            parallelism_config, processes, fsdp_plugin if fsdp_plugin is not None else settled.fsdp_plugin,
            deepspeed_plugins)[0]
    if settled is not None:
        dynamo_plugin = settled.dynamo_plugin
        distributed_type = settled.distributed_type
        precision = Precision(settled._mixed_precision, "the Accelerator made earlier in this process",
                              settled.mixed_precision, _engine(settled._mixed_precision, fp8_handler))
    else:
        distributed_type = _distributed_type(processes.distributed_type, fsdp_plugin, deepspeed_plugins)
        precision = _precision(mixed_precision, distributed_type, deepspeed_plugins, fp8_handler)
    backend = backend_to_build(layout, distributed_type, processes.num_processes)
    if settled is not None:  # the earlier Accelerator's plugins stay the run's (Accelerate keeps them in its state)
        fsdp_plugin = fsdp_plugin if fsdp_plugin is not None else settled.fsdp_plugin
        deepspeed_plugins = deepspeed_plugins if deepspeed_plugins is not None else settled.deepspeed_plugins
    layout_fsdp_plugin = _layout_fsdp_plugin(backend, fsdp_plugin)
    _fsdp_precision(fsdp_plugin if fsdp_plugin is not None else layout_fsdp_plugin, precision)
    _refuse_unsupported(backend, dynamo_plugin)
    active_deepspeed = settled.deepspeed_plugin if settled is not None else _selected(deepspeed_plugins)
    accumulation = (_accumulation(gradient_accumulation_steps, gradient_accumulation_plugin, backend, active_deepspeed)
                    if plan_accumulation else Accumulation(None, "not planned (a hand-built AcceleratorState)", None))
    return RunPlan(backend=backend, distributed_type=distributed_type, num_processes=processes.num_processes,
                   device_type=processes.device_type, fsdp_plugin=fsdp_plugin, deepspeed_plugins=deepspeed_plugins,
                   megatron_lm_plugin=megatron_lm_plugin, dynamo_plugin=dynamo_plugin,
                   parallelism_config=parallelism_config, precision=precision, accumulation=accumulation,
                   settled=settled is not None, layout_fsdp_plugin=layout_fsdp_plugin)


# -- the rules, in the order make_run_plan applies them ----------------------------------------------------------------

def _fsdp_plugin(plugin):
    """The FSDP plugin of the run when FSDP is asked for (in code or by the launcher): the given one or a default."""
    from ..config.resolve import runtime_value

    if plugin is None and not runtime_value("use_fsdp").value:
        return None
    try:
        from ..config.fsdp import FullyShardedDataParallelPlugin
    except ImportError:
        raise NotSupportedYetError("FSDP is not supported by this version of hasten yet") from None
    if plugin is None:
        return FullyShardedDataParallelPlugin()
    if not isinstance(plugin, FullyShardedDataParallelPlugin):
        raise TypeError(f"fsdp_plugin must be a FullyShardedDataParallelPlugin, got {type(plugin).__name__}")
    return plugin


def _deepspeed_plugins(deepspeed_plugin, deepspeed_plugins, fsdp_plugin, earlier_deepspeed: bool):
    """{name: plugin} (the first selected), or None when DeepSpeed is not asked for (in code or by the launcher)."""
    from ..config.resolve import runtime_value

    if deepspeed_plugin is None and deepspeed_plugins is None and not runtime_value("use_deepspeed").value:
        return None
    from ..config.deepspeed import DeepSpeedPlugin, plugins_from

    if deepspeed_plugin is None and deepspeed_plugins is None:
        deepspeed_plugin = DeepSpeedPlugin()
    elif earlier_deepspeed:
        # As Accelerate: the first Accelerator's DeepSpeed plugins are the process's; a second Accelerator given
        # plugins would silently train with the first one's, so it is refused (in Accelerate's words and error type).
        raise NotImplementedError(
            "You cannot pass in a `deepspeed_plugin` when creating a second `Accelerator`. Please make sure the "
            "first `Accelerator` is initialized with all the plugins you want to use.")
    if fsdp_plugin is not None:
        raise ConfigError("DeepSpeed and FSDP cannot be combined: pass one of deepspeed_plugin and fsdp_plugin")
    plugins = plugins_from(deepspeed_plugin, deepspeed_plugins)
    from ..core.availability import is_deepspeed_available

    if not is_deepspeed_available():
        raise ImportError('DeepSpeed is not installed: pip install "hasten[deepspeed]"')
    return plugins


def _megatron_plugin(plugin):
    """The Megatron-LM plugin: the one passed, else one built from MEGATRON_LM_* variables when the launcher (or
    the user) asked for Megatron-LM (--use_megatron_lm, ACCELERATE_USE_MEGATRON_LM=true)."""
    from ..config.megatron import MegatronLMPlugin
    from ..config.resolve import runtime_value

    if plugin is not None:
        if not isinstance(plugin, MegatronLMPlugin):
            raise TypeError(f"megatron_lm_plugin must be a MegatronLMPlugin, got {type(plugin).__name__}")
        return plugin
    return MegatronLMPlugin() if runtime_value("use_megatron_lm").value else None


def _megatron_layout(plugin, num_processes: int, parallelism_config, fsdp_plugin, deepspeed_plugins, torch_tp_plugin):
    """(parallelism_config, fsdp_plugin) of a Megatron-LM run; one line for a combination that says two things."""
    for given, name in ((parallelism_config, "parallelism_config"), (fsdp_plugin, "fsdp_plugin"),
                        (deepspeed_plugins, "deepspeed_plugin"), (torch_tp_plugin, "torch_tp_plugin")):
        if given is not None:
            raise ConfigError(f"Accelerator got both a Megatron-LM plugin and {name}; both describe how the model is "
                              "split: fix: pass one (the Megatron-LM plugin becomes a ParallelismConfig)")
    layout = megatron_layout(plugin, num_processes)
    if plugin.recompute_activations:
        from ..config.fsdp import FullyShardedDataParallelPlugin

        fsdp_plugin = FullyShardedDataParallelPlugin(fsdp_version=2, activation_checkpointing=True)
    return layout, fsdp_plugin


def megatron_layout(plugin, num_processes: int):
    """The ParallelismConfig a MegatronLMPlugin describes on `num_processes` processes: tp x pp, data parallelism
    over the rest (replicas, or FSDP2 shards with use_distributed_optimizer)."""
    from ..parallelism_config import ParallelismConfig, TorchPipelineParallelConfig

    split = plugin.tp_degree * plugin.pp_degree
    if num_processes % split:
        raise ConfigError(f"MegatronLMPlugin tp_degree={plugin.tp_degree} x pp_degree={plugin.pp_degree} = {split} "
                          f"does not divide the {num_processes} process(es); fix: launch a multiple of {split}")
    data = num_processes // split
    shard = data if plugin.use_distributed_optimizer else 1
    handler = TorchPipelineParallelConfig(microbatches=plugin.num_micro_batches) if plugin.pp_degree > 1 else None
    return ParallelismConfig(dp_replicate_size=data // shard, dp_shard_size=shard, tp_size=plugin.tp_degree,
                             cp_size=1, sp_size=1, pp_size=plugin.pp_degree, pp_handler=handler)


def _layout(config, processes: Cluster, fsdp_plugin, deepspeed_plugins):
    """(the backend the layout needs, the FSDP plugin): a new FSDP2 plugin when the layout shards and none was
    given. `backend_for_layout` (plan/layout.py) refuses what hasten cannot run."""
    from .layout import LAYOUT_BACKENDS, backend_for_layout

    layout = backend_for_layout(config, processes.num_processes, fsdp_plugin,
                                deepspeed=deepspeed_plugins is not None, device_type=processes.device_type)
    shards = layout == "fsdp" or (layout in LAYOUT_BACKENDS and config.data_parallel_size > 1)
    if shards and fsdp_plugin is None:
        from ..config.fsdp import FullyShardedDataParallelPlugin

        fsdp_plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    return layout, fsdp_plugin


def _layout_fsdp_plugin(backend: str, fsdp_plugin):
    """FSDP2's default settings for a tensor/pipeline layout that shards nothing (no FSDP plugin of its own)."""
    from .layout import LAYOUT_BACKENDS

    if backend not in LAYOUT_BACKENDS or fsdp_plugin is not None:
        return None
    from ..config.fsdp import FullyShardedDataParallelPlugin

    return FullyShardedDataParallelPlugin(fsdp_version=2)


def _fsdp_precision(plugin, precision) -> None:
    """The FSDP plugin's policy from the run's precision, unless the plugin has its own (as Accelerate's state
    fills it)."""
    if plugin is not None:
        plugin.set_mixed_precision(precision.trains_in)


def _refuse_unsupported(backend: str, dynamo_plugin) -> None:
    """Combinations hasten cannot build, refused before anything is."""
    compiles = str(getattr(dynamo_plugin.backend, "value", dynamo_plugin.backend)).lower() not in ("no", "none")
    if backend == "deepspeed" and compiles:
        raise NotSupportedYetError("torch.compile (dynamo_backend) together with DeepSpeed is not supported by hasten yet")


def _distributed_type(detected: DistributedType, fsdp_plugin, deepspeed_plugins) -> DistributedType:
    """A plugin makes the run FSDP or DeepSpeed. Unlike Accelerate, both also run on CPU processes (gloo) and in one
    process (the backend makes a one-process group), so that a sharded checkpoint resumes on any number of
    processes; ranks stay torch.distributed's, so every process knows its index and reads its share of the data."""
    if deepspeed_plugins is not None:
        return DistributedType.DEEPSPEED
    if fsdp_plugin is not None:
        return DistributedType.FSDP
    return detected


def _engine(setting: str, fp8_handler) -> str | None:
    from .precision import fp8_engine

    return fp8_engine(fp8_handler) if setting == "fp8" else None


def _precision(argument, distributed_type: DistributedType, deepspeed_plugins, fp8_handler=None) -> Precision:
    """The mixed_precision setting (argument > launcher/environment > "no") and where it came from. DeepSpeed takes
    it into each plugin's config (whose own fp16/bf16 block may decide, as in Accelerate); FSDP's backend takes it
    from the precision policy built from `trains_in`."""
    from ..config.resolve import resolve_mixed_precision, runtime_value

    setting = resolve_mixed_precision(argument)
    if argument is not None:
        source = "Accelerator(mixed_precision=...)"
    else:
        resolved = runtime_value("mixed_precision")
        source = resolved.origin if resolved.source != "default" else "default"
    trains_in = setting
    if deepspeed_plugins is not None:
        told = "Accelerator(mixed_precision=...)" if argument is not None else "the mixed_precision setting"
        for plugin in deepspeed_plugins.values():
            plugin.set_mixed_precision(setting, told)
        if distributed_type == DistributedType.DEEPSPEED:
            trains_in = _selected(deepspeed_plugins).mixed_precision
    return Precision(setting, source, trains_in, _engine(setting, fp8_handler))


def _selected(deepspeed_plugins):
    """The selected plugin of {name: DeepSpeedPlugin} (plugins_from selects the first), or None."""
    return next((p for p in (deepspeed_plugins or {}).values() if p.selected), None)


def _accumulation(steps_argument, plugin, backend: str, deepspeed_plugin) -> Accumulation:
    """The GradientAccumulationPlugin of the run. The launcher's value replaces the argument, as in Accelerate (the
    settings table's precedence says so); under DeepSpeed the config's count and the Accelerator's agree."""
    from ..config.handlers import GradientAccumulationPlugin
    from ..config.resolve import runtime_value

    steps = runtime_value("gradient_accumulation_steps", steps_argument)
    if steps.source == "environment":
        source = f"environment variable {steps.origin}"
    elif steps.value == 1:
        source = "default"
    else:  # the launcher's flag or config file (named by HASTEN_CONFIG_SOURCES), else the argument
        source = steps.origin if steps.source in ("flag", "file") else "Accelerator(gradient_accumulation_steps=...)"
    if plugin is not None:
        if steps.value != 1:
            raise ConfigError(
                "pass either gradient_accumulation_steps or gradient_accumulation_plugin, not both "
                "(set GradientAccumulationPlugin(num_steps=...) instead)"
            )
    else:
        if not isinstance(steps.value, int) or steps.value < 1:
            raise ConfigError(f"gradient_accumulation_steps must be a positive integer, got {steps.value!r}")
        plugin = GradientAccumulationPlugin(num_steps=steps.value)
    if plugin.num_steps is not None:
        if plugin.num_steps != 1 and source == "default":
            source = "GradientAccumulationPlugin(num_steps=...)"
        if backend == "deepspeed":
            steps, source = _deepspeed_accumulation(deepspeed_plugin, plugin.num_steps, source)
            if steps != plugin.num_steps:  # a copy: the user's plugin keeps what the user set
                plugin = replace(plugin, num_steps=steps)
    return Accumulation(plugin.num_steps, source, plugin)


def _deepspeed_accumulation(plugin, steps: int, source: str) -> tuple:
    """DeepSpeed's config and the Accelerator agree on the steps: a missing side takes the other's value."""
    from ..config.deepspeed import AUTO

    if plugin is None:
        raise ConfigError(
            "no DeepSpeedPlugin is active: pass Accelerator(deepspeed_plugin=...) or launch with --use_deepspeed"
        )
    configured = plugin.get_value("gradient_accumulation_steps")
    if configured not in (None, AUTO):
        if steps == 1 and source.endswith("default"):
            return int(configured), "the DeepSpeed config"
        from ..config.resolve import strict

        if not _same_number(configured, steps) and not strict():
            # Accelerate warns and trains with the DeepSpeed config's value (the engine and `accumulate` both use
            # it, so nothing runs inconsistently); hasten's strict setting refuses the mismatch (fill_auto below).
            logging.getLogger("hasten.accelerator").warning(
                f"Gradient accumulation steps mismatch: GradientAccumulationPlugin has {steps}, DeepSpeed config has "
                f"{configured}. Using DeepSpeed's value.")
            return int(configured), "the DeepSpeed config"
    plugin.fill_auto({"gradient_accumulation_steps": steps}, source)
    return steps, source


def _same_number(a, b) -> bool:
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


__all__ = ["Accumulation", "Cluster", "Precision", "RunPlan", "make_run_plan", "megatron_layout"]
