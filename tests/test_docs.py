"""The user-facing documents stay true to the code where a machine can check it."""

import re
from pathlib import Path

from hasten.config.settings import BY_NAME

DOCS = Path(__file__).resolve().parent.parent / "docs"
LABELS = ("Accelerate's switch: ", "hasten setting: ", "addition", "invisible", "Accelerate bug fixed: ",
          "clearer error", "same as Accelerate", "not built: ")


def _entries():
    text = (DOCS / "differences.md").read_text()
    body = text.split("\n## ", 1)[1]  # after the legend
    return [line for line in body.splitlines() if line.startswith("- ")]


def test_every_difference_is_labelled_with_one_of_the_legends_labels():
    entries = _entries()
    assert len(entries) > 100
    unlabelled = [e[:100] for e in entries if not any(e.startswith(f"- *[{label}") for label in LABELS)]
    assert unlabelled == [], "docs/differences.md entries without a legend label"


def test_a_hasten_setting_named_by_a_difference_exists():
    # "[hasten setting: X]" must name a real settings-table row (or one of the ProjectConfiguration fields).
    named = set()
    for entry in _entries():
        for match in re.finditer(r"\*\[hasten setting: ([^\]]+)\]\*", entry):
            named.update(word.strip() for word in re.split(r"[,(]| or ", match.group(1)))
    project_fields = {"ProjectConfiguration", "automatic_resume=True", "handle_preemption=True)", ""}
    missing = sorted(n for n in named if n not in BY_NAME and n not in project_fields)
    assert missing == []


def test_the_not_built_list_names_only_blocks_with_unbuilt_rows():
    # docs/configuration.md's "Features hasten has not built yet": a config-file block named there must still have
    # a row that is refused; once every row of a block is built, the sentence goes.
    from hasten.config.settings import SETTINGS

    text = (DOCS / "configuration.md").read_text()
    section = text.split("### Features hasten has not built yet", 1)[1].split("\n#", 1)[0]
    blocks = {s.name for s in SETTINGS if s.role == "file" and s.kind == "dict"}
    named = {word for word in re.findall(r"`(\w+)`", section) if word in blocks}
    built = sorted(b for b in named if all(s.built for s in SETTINGS if s.file_key and s.file_key[0] == b))
    assert built == [], f"docs/configuration.md lists built blocks as not built: {built}"


def test_messages_and_docstrings_name_no_tracker_issue():
    # A user reads errors and docstrings without hasten's issue tracker: "issue 14" tells them nothing.
    import ast

    source = DOCS.parent / "src" / "hasten"
    found = []
    for path in sorted(source.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.search(r"\bissue \d+", node.value):
                found.append(f"{path.relative_to(source)}:{node.lineno}")
    assert found == [], f"strings that name a tracker issue: {found}"
