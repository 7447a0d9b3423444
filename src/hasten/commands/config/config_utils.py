"""Asking questions on a terminal: numbered choices, yes/no, typed values, each checked by the settings table."""

from __future__ import annotations

import argparse

from ...core.errors import ConfigError
from ...core.env import parse_bool, parse_int


class _Parser(argparse.ArgumentParser):
    """argparse that ends a bad command line with one line and a pointer to --help, not a page of usage."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


class _Cancelled(Exception):
    pass


def __getattr__(name: str):
    if name == "DYNAMO_BACKENDS":
        # the torch.compile backends the questionnaire offers, upper-cased as Accelerate lists them ("no" aside);
        # read from the settings table when asked, so the list and the check never disagree
        from ...config import settings

        return [choice.upper() for choice in settings.get("dynamo_backend").choices if choice != "no"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class SubcommandHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help for a subcommand: the usage line drops the parent's `<command> [<args>]` placeholder."""

    def _format_usage(self, usage, actions, groups, prefix):
        return super()._format_usage(usage, actions, groups, prefix).replace("<command> [<args>] ", "")


class Questions:
    """Ask on stdin/stdout; a blank answer takes the default; a bad answer is asked again (a few times)."""

    ATTEMPTS = 5

    def __init__(self, read=input, write=print):
        self._read, self._write = read, write

    def _answer(self, prompt: str) -> str:
        try:
            return self._read(prompt).strip()
        except EOFError:
            raise ConfigError(
                "the questionnaire ended before all questions were answered (no more input); fix: run it in a "
                "terminal, or use `hasten config default` for a non-interactive config"
            ) from None
        except KeyboardInterrupt:
            raise _Cancelled from None

    def ask(self, question: str, default, parse=str):
        shown = "" if default is None else f" [{_show(default)}]"
        for _ in range(self.ATTEMPTS):
            text = self._answer(f"{question}{shown}: ")
            if not text:
                if default is not None:
                    return default
                self._write("  Please give an answer.")
                continue
            try:
                return parse(text)
            except ValueError as error:
                self._write(f"  {error}")
        raise ConfigError(f"no valid answer to {question!r} after {self.ATTEMPTS} tries")

    def yes_no(self, question: str, default: bool = False) -> bool:
        def parse(text):
            try:
                return parse_bool(text)
            except ValueError:
                raise ValueError("answer yes or no") from None

        return self.ask(f"{question} (yes/no)", default, parse)

    def choose(self, question: str, options, default: int = 0):
        """Numbered choices; returns the chosen option's value. `options` are (value, label) pairs."""
        self._write(question)
        for index, (_, label) in enumerate(options):
            self._write(f"  [{index}] {label}")

        def parse(text):
            if text.isdigit() and int(text) < len(options):
                return options[int(text)][0]
            for value, label in options:
                if text.lower() in (str(value).lower(), label.lower()):
                    return value
            raise ValueError(f"answer a number from 0 to {len(options) - 1}")

        for _ in range(self.ATTEMPTS):
            text = self._answer(f"Your choice [{default}]: ")
            if not text:
                return options[default][0]
            try:
                return parse(text)
            except ValueError as error:
                self._write(f"  {error}")
        raise ConfigError(f"no valid answer to {question!r} after {self.ATTEMPTS} tries")

    def setting(self, name: str, default=None, *, question: str | None = None, options=None, labels=None, parse=None):
        """Ask for setting `name` as its row in the settings table describes it: the question, the allowed
        values (built ones only; `options` narrows and orders them), and the check of a typed answer."""
        from ...config.settings import get

        row = get(name)
        question = question or row.question
        if row.kind == "bool":
            return self.yes_no(question, bool(default))
        if row.choices and row.kind != "bool_or_str":
            allowed = [value for value in row.allowed() if value not in row.unbuilt_values]
            values = [value for value in (options or allowed) if value in allowed]
            labels = labels or {}
            pairs = [(value, labels.get(value, str(value))) for value in values]
            start = values.index(default) if default in values else 0
            return self.choose(question, pairs, start)
        if parse is None:
            if row.kind == "int":
                def parse(text):
                    return parse_int(text, row.minimum, row.maximum)
            else:
                def parse(text):
                    try:
                        return row.convert(text)
                    except ValueError as error:
                        raise ValueError(f"answer {str(error)[len('expected '):]}") from None
        return self.ask(question, default, parse)


def _show(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)
