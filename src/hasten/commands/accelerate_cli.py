"""Accelerate's `commands.accelerate_cli` path (the umbrella command's `main`); the code is `hasten.commands.cli`."""

from .cli import main  # noqa: F401
