"""`hasten env`: what a bug report needs — versions, platform, devices and the configuration in use."""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
from shutil import which


def collect_info(config_file: str | None = None) -> dict:
    import numpy
    import psutil
    import torch

    import hasten

    info = {
        "`hasten` version": hasten.__version__,
        "Platform": platform.platform(),
        "`hasten` bash location": which("hasten") or "Not found",
        # the command Accelerate's scripts call (the alias installs one): Accelerate's report names it too
        "`accelerate` bash location": which("accelerate") or "Not found",
        "`accelerate` alias": _alias_status(),
        "Python version": platform.python_version(),
        "Numpy version": numpy.__version__,
        "PyTorch version": torch.__version__,
        "PyTorch accelerator": "CUDA" if torch.cuda.is_available() else "N/A",
        "System RAM": f"{psutil.virtual_memory().total / 1024**3:.2f} GB",
    }
    if torch.cuda.is_available():
        info["GPU type"] = torch.cuda.get_device_name()
        info["GPU count"] = torch.cuda.device_count()
    for key in sorted(os.environ):
        if key.startswith(("HASTEN_", "ACCELERATE_")):
            info[f"env {key}"] = os.environ[key]
    info["Config file"] = _config_summary(config_file)
    return info


def _alias_status() -> str:
    from .alias import alias_status

    try:
        return alias_status()
    except Exception as error:  # noqa: BLE001 - a bug report must still print
        return f"unknown ({type(error).__name__}: {error})"


def _config_summary(config_file):
    try:
        from ..config import file as config_files
    except ImportError:
        return "Not found"
    find = getattr(config_files, "find_config_file", None)
    try:
        path = find(config_file) if find else (config_file or config_files.default_config_path())
        if not path or not os.path.isfile(path):
            return "Not found"
        return config_files.load_config_file(path)
    except Exception as error:  # noqa: BLE001 - a bug report must still print when the config is broken
        return f"{config_file or 'the default config file'} cannot be read: {error}"


_SECTIONS = (
    ("hasten", ("`hasten` version", "`hasten` bash location", "`accelerate` alias")),
    ("Platform", ("Platform", "Python version", "Numpy version", "PyTorch version", "PyTorch accelerator",
                  "System RAM", "GPU type", "GPU count")),
)
# optional libraries whose versions matter in a bug report, shown when installed
_LIBRARIES = ("accelerate", "transformers", "datasets", "peft", "deepspeed", "safetensors", "tensorboard", "wandb",
              "mlflow", "torchvision", "tqdm", "rich")


def _installed_libraries() -> dict:
    import importlib.metadata

    found = {}
    for name in _LIBRARIES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def collect_sections(info: dict) -> list:
    """`info` grouped for display: [(title, [(key, value), ...]), ...]; nothing of `info` is left out."""
    shown, sections = set(), []
    for title, keys in _SECTIONS:
        rows = [(key, info[key]) for key in keys if key in info]
        shown.update(key for key, _ in rows)
        sections.append((title, rows))
    libraries = _installed_libraries()
    if libraries:
        sections.append(("Installed libraries", list(libraries.items())))
    variables = [(key, value) for key, value in info.items() if key.startswith("env ")]
    shown.update(key for key, _ in variables)
    sections.append(("Environment variables", variables or [("(none set)", "")]))
    config = info.get("Config file")
    shown.add("Config file")
    if isinstance(config, dict):
        sections.append(("Config file", [(key, value) for key, value in config.items()]))
    else:
        sections.append(("Config file", [("Config file", config)]))
    rest = [(key, value) for key, value in info.items() if key not in shown]
    if rest:
        sections.append(("Other", rest))
    return sections


def render_plain(sections: list) -> str:
    """A text table: one block per section, keys right-aligned against their values (`key: value`)."""
    width = max((len(str(key)) for _, rows in sections for key, _ in rows), default=0)
    lines = []
    for title, rows in sections:
        lines += ["", title, "-" * len(title)]
        lines += [f"{str(key).rjust(width)}: {value}" if value != "" else str(key).rjust(width) for key, value in rows]
    return "\n".join(lines[1:])


def print_rich(sections: list, console=None) -> None:
    """The sections as one rich table (rich must be installed)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="hasten environment", show_header=False, title_justify="left")
    table.add_column("key", style="bold", justify="right")
    table.add_column("value", overflow="fold")
    for title, rows in sections:
        table.add_section()
        table.add_row(f"[cyan]{title}[/cyan]", "")
        for key, value in rows:
            table.add_row(str(key), str(value))
    (console or Console()).print(table)


def render_markdown(info: dict) -> str:
    """The list Accelerate's `accelerate env` prints, for pasting into a GitHub issue."""
    lines = []
    for key, value in info.items():
        if isinstance(value, dict):
            lines.append(f"- {key}:")
            lines += [f"\t- {k}: {v}" for k, v in value.items()]
        else:
            lines.append(f"- {key}: {value}")
    return "\n".join(lines)


def env_command_parser(subparsers=None) -> argparse.ArgumentParser:
    description = "Print environment information for bug reports."
    if subparsers is not None:
        parser = subparsers.add_parser("env", description=description)
    else:
        parser = argparse.ArgumentParser(prog="hasten env", description=description)
    parser.add_argument("--config_file", "--config-file", default=None, help="Config file to show.")
    parser.add_argument("--table", action="store_true",
                        help="Print a table grouped by topic, with the installed libraries (rich on a terminal, "
                             "aligned text when piped) instead of the bug-report list (hasten only).")
    parser.add_argument("--markdown", action="store_true",
                        help="Print the bug-report list (the default, as `accelerate env` does).")
    if subparsers is not None:
        parser.set_defaults(func=env_command)
    return parser


def env_command(args) -> dict:
    """Print the report for `args.config_file` and return what it holds (as Accelerate's `env_command` does):
    Accelerate's bug-report list, or with `args.table` hasten's grouped table."""
    info = collect_info(getattr(args, "config_file", None))
    if getattr(args, "markdown", False) or not getattr(args, "table", False):
        print("\nCopy-and-paste the text below in your GitHub issue\n")
        print(render_markdown(info))
        return info
    sections = collect_sections(info)
    # rich draws boxes and colours for a person at a terminal; piped output stays plain text for pasting/grepping
    if sys.stdout.isatty() and importlib.util.find_spec("rich") is not None:
        print_rich(sections)
    else:
        print(render_plain(sections))
    return info


def main(argv=None) -> int:
    env_command(env_command_parser().parse_args(argv))
    return 0
