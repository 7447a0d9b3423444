"""Checks that a "complete" example script contains what each feature example adds to the base example
(Accelerate's `accelerate.test_utils.examples`)."""

from __future__ import annotations

import os

_FUNCTION_ENDS = {"training_function": "def main", "main": "if __name__"}
_BASE_EXAMPLE = os.path.join("examples", "nlp_example.py")


def get_function_contents_by_name(lines: list, name: str) -> list:
    """The lines of `training_function` (up to `def main`) or of `main` (up to `if __name__`) in a script's lines."""
    if name not in _FUNCTION_ENDS:
        raise ValueError(f"name must be 'training_function' or 'main', got {name!r}")
    start = next((i for i, line in enumerate(lines) if f"def {name}" in line), None)
    if start is None:
        return []
    body = [lines[start]]
    for line in lines[start + 1:]:
        if _FUNCTION_ENDS[name] in line:
            break
        body.append(line)
    return body


def clean_lines(lines: list) -> list:
    """`lines` without comment lines and empty lines."""
    return [line for line in lines if not line.lstrip().startswith("#") and line != "\n"]


def _function(path: str, name: str) -> list:
    with open(path) as handle:
        return clean_lines(get_function_contents_by_name(handle.readlines(), name))


def compare_against_test(base_filename: str, feature_filename: str, parser_only: bool,
                         secondary_filename: str | None = None) -> list:
    """Lines the feature script adds to the base example (`examples/nlp_example.py`, and `secondary_filename` if
    given) that `base_filename` (the complete example) lacks: empty when the complete example has them all.

    `parser_only` compares the `main()` functions, otherwise the `training_function()`s. Lines marked for
    mocked test data (`TESTING_MOCKED_DATALOADERS`) are not features.
    """
    name = "main" if parser_only else "training_function"
    template = set(_function(_BASE_EXAMPLE, name))
    if secondary_filename is not None:
        template |= set(_function(secondary_filename, name))
    complete = set(_function(base_filename, name))
    added = [line for line in _function(feature_filename, name)
             if line not in template and "TESTING_MOCKED_DATALOADERS" not in line and "get_dataloaders(" not in line]
    return [line for line in added if line not in complete]
