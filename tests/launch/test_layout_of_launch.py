"""Where the launcher's code lives: the plan and the runner in `hasten.launch`, the command line in
`hasten.commands.launch`, which imports them (never the other way), and Accelerate's names still at its paths."""

import ast
import pathlib

import hasten
from hasten.commands.launch import launch_command_parser

LAUNCH = pathlib.Path(hasten.__file__).parent / "launch"


def _imported_modules(path: pathlib.Path) -> list:
    """Absolute names of the hasten modules `path` imports (relative imports resolved)."""
    package = "hasten.launch"
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                names.append(f"{base}.{node.module}" if node.module else base)
            else:
                names.append(node.module or "")
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return names


def test_no_module_of_launch_imports_commands():
    offenders = [f"{path.name} imports {name}" for path in sorted(LAUNCH.glob("*.py"))
                 for name in _imported_modules(path) if (name + ".").startswith("hasten.commands.")]
    assert offenders == []


def test_the_defaults_a_hand_built_namespace_gets_are_the_parsers():
    # Accelerate's launchers take a Namespace built by hand; hasten fills what it lacks with the values the parser
    # would give, now computed in launch/ without the parser: the two must not drift apart.
    from hasten.launch.plan import _with_launch_defaults, launch_defaults

    parsed = vars(launch_command_parser().parse_args(["script.py"]))
    defaults = launch_defaults()
    assert defaults == parsed
    assert {name: type(value) for name, value in defaults.items()} == {name: type(v) for name, v in parsed.items()}
    import argparse

    filled = _with_launch_defaults(argparse.Namespace(training_script="t.py", num_processes=2, multi_gpu=False,
                                                      fsdp_offload_params=False))
    assert filled.num_processes == 2 and filled.training_script == "t.py" and filled.tee == "0"
    assert filled.multi_gpu is False and filled.use_fsdp is False
    assert filled.fsdp_offload_params is None  # Accelerate's False for an on/off value is hasten's "not typed"


def test_accelerates_launch_names_resolve_to_the_code_in_launch():
    from hasten.commands import launch as command
    from hasten.launch import plan, run

    launchers = ("simple_launcher", "multi_gpu_launcher", "deepspeed_launcher")
    for name in (*launchers, "_run_distributed", "_describe_failures"):
        assert getattr(command, name) is getattr(run, name) and getattr(run, name).__module__ == "hasten.launch.run"
    for name in ("LaunchPlan", "plan_launch", "_resolve_port", "PORT_IN_USE_WARNING"):
        assert getattr(command, name) is getattr(plan, name)
    assert plan.plan_launch.__module__ == "hasten.launch.plan"
    assert issubclass(command.PortInUseError, ConnectionError)
