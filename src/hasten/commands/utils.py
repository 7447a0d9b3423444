"""Accelerate's `commands.utils`: an argparse parser whose `--snake_case` flags also answer to `--kebab-case`,
and which records on the namespace (`nondefault`, a set of dests) which options the command line gave, so a
command can tell "left at its default" from "given, with the default's value"."""

from __future__ import annotations

import argparse

_RECORDING_TYPES: dict = {}


def _recording(action_type: type) -> type:
    """A subclass of `action_type` that also adds its dest to `namespace.nondefault` when the option is given."""
    if action_type not in _RECORDING_TYPES:
        def __call__(self, parser, namespace, values, option_string=None):
            super(recording, self).__call__(parser, namespace, values, option_string)
            if getattr(namespace, "nondefault", None) is None:
                namespace.nondefault = set()
            namespace.nondefault.add(self.dest)

        recording = type(f"Recording{action_type.__name__}", (action_type,), {"__call__": __call__})
        _RECORDING_TYPES[action_type] = recording
    return _RECORDING_TYPES[action_type]


def _add_both_spellings(add_argument, args, kwargs) -> argparse.Action:
    spellings = []
    for name in args:
        spellings.append(name)
        kebab = "--" + name[2:].replace("_", "-") if name.startswith("--") else name
        if kebab != name:
            spellings.append(kebab)
    action = add_argument(*spellings, **kwargs)
    if action.option_strings:  # positionals are always given: nothing to record
        action.__class__ = _recording(type(action))
    return action


class CustomArgumentGroup(argparse._ArgumentGroup):
    """An argument group with `CustomArgumentParser`'s two spellings and recording."""

    def add_argument(self, *args, **kwargs):
        return _add_both_spellings(super().add_argument, args, kwargs)


class CustomArgumentParser(argparse.ArgumentParser):
    """`--learning_rate` also parses as `--learning-rate`; `namespace.nondefault` names the options given."""

    def add_argument(self, *args, **kwargs):
        return _add_both_spellings(super().add_argument, args, kwargs)

    def add_argument_group(self, *args, **kwargs):
        group = CustomArgumentGroup(self, *args, **kwargs)
        self._action_groups.append(group)
        return group
