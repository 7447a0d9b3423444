"""`hasten env`: Accelerate's bug-report list by default; `--table` groups every fact of it (plain text when piped,
rich on a terminal)."""

from __future__ import annotations

import importlib.util
import io

import pytest
import torch

from hasten.commands import env as env_command


def _info():
    return {"`hasten` version": "0.1.0", "Platform": "Linux", "PyTorch version": torch.__version__,
            "System RAM": "8.00 GB", "env HASTEN_DEBUG_MODE": "1",
            "Config file": {"distributed_type": "MULTI_CPU", "num_processes": 2}, "Something new": "x"}


def test_sections_keep_every_fact():
    sections = dict(env_command.collect_sections(_info()))
    assert sections["hasten"] == [("`hasten` version", "0.1.0")]
    assert ("PyTorch version", torch.__version__) in sections["Platform"]
    assert sections["Environment variables"] == [("env HASTEN_DEBUG_MODE", "1")]
    assert sections["Config file"] == [("distributed_type", "MULTI_CPU"), ("num_processes", 2)]
    assert sections["Other"] == [("Something new", "x")]  # a fact without a section is still shown


def test_plain_table_aligns_keys():
    text = env_command.render_plain(env_command.collect_sections(_info()))
    lines = text.splitlines()
    assert "Platform" in lines and "--------" in lines
    rows = [line for line in lines if ": " in line]
    assert len({line.index(": ") for line in rows}) == 1  # one column of colons
    assert any(line.endswith(f"PyTorch version: {torch.__version__}") for line in rows)
    assert any(line.endswith("num_processes: 2") for line in rows)


def test_piped_output_is_the_plain_table(monkeypatch, capsys):
    monkeypatch.setenv("HASTEN_DEBUG_MODE", "1")
    assert env_command.main(["--table"]) == 0
    out = capsys.readouterr().out
    assert "Environment variables\n---------------------" in out
    assert "│" not in out and "\x1b[" not in out  # no box drawing or colour codes when piped


def test_the_default_is_accelerates_markdown_list_for_issues(monkeypatch, capsys):
    monkeypatch.setenv("HASTEN_DEBUG_MODE", "1")
    for argv in ([], ["--markdown"]):
        assert env_command.main(argv) == 0
        out = capsys.readouterr().out
        assert out.startswith("\nCopy-and-paste the text below in your GitHub issue\n")
        assert f"- PyTorch version: {torch.__version__}" in out and "- env HASTEN_DEBUG_MODE: 1" in out
        assert "Environment variables\n---" not in out  # not the table


def test_env_shows_whether_the_accelerate_alias_is_active(capsys):
    from hasten.commands.alias import alias_status

    info = env_command.collect_info()
    assert info["`accelerate` alias"] == alias_status()
    assert ("`accelerate` alias", alias_status()) in dict(env_command.collect_sections(info))["hasten"]
    assert env_command.main([]) == 0
    assert f"`accelerate` alias: {alias_status()}" in capsys.readouterr().out


@pytest.mark.skipif(importlib.util.find_spec("rich") is None, reason="rich is not installed")
def test_rich_table():
    from rich.console import Console

    buffer = io.StringIO()
    env_command.print_rich(env_command.collect_sections(_info()), Console(file=buffer, width=100, color_system=None))
    text = buffer.getvalue()
    assert "hasten environment" in text and "PyTorch version" in text and "MULTI_CPU" in text
