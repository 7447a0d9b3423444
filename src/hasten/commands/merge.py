"""`accelerate.commands.merge` at its Accelerate path: the `merge-weights` command lives in merge_weights.py."""

from __future__ import annotations

from .merge_weights import description, main, merge_command, merge_command_parser

__all__ = ["description", "main", "merge_command", "merge_command_parser"]
