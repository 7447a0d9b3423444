"""Helpers for the tests that read hasten's source (AST rules: who may call what)."""

from __future__ import annotations

import ast


def dotted(node) -> str:
    """The dotted name an expression spells (`os.path.isfile`, `dist.all_reduce`); "" parts for what is not a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))
