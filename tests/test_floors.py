"""The floors: hasten's packages stand in one order, and an import runs down a floor, never up.

core at the bottom, the public surface (the facade, `utils/`, the CLI) at the top. A module may import from its own
floor or any floor below it. An import that runs up ties a lower room to a higher one: the lower one can no longer be
read, tested or reused alone, and the next change closes a cycle. The graph is the cycle test's (`ast`, every
`import` wherever it sits, imports inside functions included), so a lazy import is counted like any other.

To add a module: it takes the floor of the longest prefix in FLOORS that names it (a new top-level package needs a
line). To keep an upward import that must stay, add it to UPWARD_IMPORTS with its reason; an entry that is no longer
needed fails the test, so the list only shrinks.
"""

from __future__ import annotations

import functools

import test_import_cycles

# parsed once for the whole file: the graph is read from ~250 source files
import_graph = functools.lru_cache(maxsize=1)(test_import_cycles.import_graph)

# Lowest first: (floor, the modules and packages on it). A module's floor is its longest matching prefix, so a
# module can stand on a lower floor than its package (a backend's settings dataclass is read by config/).
FLOORS = (
    ("core", ("hasten.core",)),
    # the settings table, the config file, precedence, kwargs handlers, and each backend's settings dataclass
    ("config", ("hasten.config", "hasten.backends.fsdp.plugin", "hasten.backends.deepspeed.plugin")),
    # durable files, safe loading, fast I/O, async saving: bytes on disk, no process group needed
    ("storage", ("hasten.checkpoint",)),
    # who am I, joining the group, collectives, plans; preemption, the hang doctor and error files watch them
    ("distributed and resilience", ("hasten.distributed", "hasten.resilience")),
    # public modules that are the runtime core: who am I (state), which mesh (parallelism_config)
    ("runtime core", ("hasten.state", "hasten.parallelism_config")),
    # which batches are mine (the scheduler reads the data-parallel size from here)
    ("data", ("hasten.data",)),
    # public modules whose classes the backends return (AcceleratedOptimizer, AcceleratedScheduler)
    ("wrapped objects", ("hasten.optimizer", "hasten.scheduler")),
    ("subsystems", ("hasten.training", "hasten.observe", "hasten.big_model",
                    "hasten.checkpoint.layout")),  # the layout writes a whole save_state folder: it reads the state
    ("backends", ("hasten.backends",)),
    ("launch", ("hasten.launch",)),
    # Accelerate's public modules, the facade, the index (utils/) and the CLI
    ("public surface", (
        "hasten", "hasten.__main__", "hasten.accelerator", "hasten.big_modeling", "hasten.checkpointing",
        "hasten.commands", "hasten.data_loader", "hasten.hooks", "hasten.inference", "hasten.launchers",
        "hasten.local_sgd", "hasten.logging", "hasten.memory_utils", "hasten.test_utils", "hasten.tracking",
        "hasten.utils",
    )),
)

# (importer, imported) -> why it stays. Each is counted by the test; remove the line when the import goes.
UPWARD_IMPORTS = {
    ("hasten.distributed.operations", "hasten.state"):
        "Accelerate's collectives (gather, broadcast, reduce...) ask the shared PartialState what kind of run this is",
    ("hasten.distributed.rng", "hasten.state"):
        "set_seed(device_specific=True) and synchronize_rng_states read the process index from PartialState, as "
        "Accelerate's do",
    ("hasten.distributed.sequence_parallel", "hasten.state"):
        "sp_group() with no state argument reads the shared AcceleratorState's parallelism config, as the public "
        "collectives read PartialState",
    ("hasten.big_model.bnb", "hasten.big_modeling"):
        "load_and_quantize_model ends in Accelerate's dispatch_model/init_empty_weights, whose home is big_modeling.py",
    ("hasten.config.megatron", "hasten.parallelism_config"):
        "MegatronLMPlugin's sizes become a ParallelismConfig (hasten runs Megatron layouts on its own TP/PP/FSDP)",
}


def floor_of(module: str, floors=FLOORS):
    """(index, name) of the floor `module` stands on, or None when no prefix in `floors` names it."""
    best = None
    for index, (name, prefixes) in enumerate(floors):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index, name)
    return None if best is None else best[1:]


def upward_imports(graph: dict, floors=FLOORS) -> list:
    """Every (importer, imported) pair where the imported module stands on a higher floor."""
    found = []
    for importer in sorted(graph):
        for imported in sorted(graph[importer]):
            low, high = floor_of(importer, floors), floor_of(imported, floors)
            if low is not None and high is not None and high[0] > low[0]:
                found.append((importer, imported))
    return found


def _explain(importer: str, imported: str) -> str:
    (low, low_name), (high, high_name) = floor_of(importer), floor_of(imported)
    return (f"{importer} (floor {low} '{low_name}') imports {imported} (floor {high} '{high_name}'): move what it "
            f"needs down to floor '{low_name}' or below, or import it from where it lives lower; if it must stay, "
            f"add ({importer!r}, {imported!r}): '<why>' to UPWARD_IMPORTS in tests/test_floors.py")


def test_every_module_has_a_floor():
    missing = [module for module in sorted(import_graph()) if floor_of(module) is None]
    assert not missing, "modules on no floor (add their package to FLOORS in tests/test_floors.py): " + ", ".join(missing)


def test_no_import_runs_up_a_floor():
    upward = [pair for pair in upward_imports(import_graph()) if pair not in UPWARD_IMPORTS]
    assert not upward, "imports that run up a floor:\n" + "\n".join(_explain(*pair) for pair in upward)


def test_every_listed_upward_import_is_still_there():
    graph = import_graph()
    upward = set(upward_imports(graph))
    stale = [pair for pair in UPWARD_IMPORTS if pair not in upward]
    assert not stale, "UPWARD_IMPORTS lists imports that no longer run up (remove them from tests/test_floors.py): " + (
        ", ".join(f"{a} -> {b}" for a, b in stale))


def test_the_check_sees_an_upward_import_and_the_longest_prefix_wins():
    floors = (("low", ("pkg.low", "pkg.high.settings")), ("high", ("pkg.high",)))
    graph = {"pkg.low.a": {"pkg.high.b", "pkg.high.settings"}, "pkg.high.b": {"pkg.low.a"}, "pkg.high.settings": set()}
    assert upward_imports(graph, floors) == [("pkg.low.a", "pkg.high.b")]
    assert floor_of("pkg.high.settings.x", floors) == (0, "low") and floor_of("other", floors) is None


def test_imports_inside_functions_count():
    # config/megatron.py imports ParallelismConfig only inside a method: the floor check must still see it.
    assert "hasten.parallelism_config" in import_graph()["hasten.config.megatron"]
