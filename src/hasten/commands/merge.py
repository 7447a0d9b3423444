"""`accelerate.commands.merge` at its Accelerate path: the `merge-weights` command lives in merge_weights.py."""

from __future__ import annotations

from .merge_weights import main, merge_command, merge_command_parser

__all__ = ["main", "merge_command", "merge_command_parser"]
