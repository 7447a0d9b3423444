"""Call every public class and function named in a list (argv[1]) with stand-in arguments and write, as JSON to
argv[2], {entry: "refused: <first line>" | "built" | "not callable"} (tests/test_public_names.py::test_count).

A name refuses on use when calling it raises one of hasten's refusal errors; anything else (it ran, or it
failed on the stand-in arguments) counts as built. Run in a scratch folder with stdin closed: some names write
files or ask questions. Each call gets a few seconds (a stand-in can make a loop wait forever).
"""

import importlib
import inspect
import json
import signal
import sys
import warnings
from unittest import mock

from hasten.core.errors import NotSupportedYetError


class _TooLong(BaseException):
    pass


def _stop(*_):
    raise _TooLong()


def classify(entry: str) -> str:
    module, _, name = entry.partition(":")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        obj = getattr(importlib.import_module(module), name)
    if not (inspect.isfunction(obj) or inspect.isclass(obj)):
        return "not callable"
    try:
        parameters = [p for p in inspect.signature(obj).parameters.values()
                      if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        parameters = []
    signal.alarm(5)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obj(*[mock.MagicMock() for _ in parameters])
    except NotSupportedYetError as error:
        return "refused: " + (str(error).splitlines() or [""])[0]
    except BaseException:  # noqa: BLE001 - failing on a stand-in argument is what a built name does
        return "built"
    finally:
        signal.alarm(0)
    return "built"


if __name__ == "__main__":
    signal.signal(signal.SIGALRM, _stop)
    entries = [line.strip() for line in open(sys.argv[1]) if ":" in line and not line.startswith("#")]
    with open(sys.argv[2], "w") as out:
        json.dump({entry: classify(entry) for entry in entries}, out)
