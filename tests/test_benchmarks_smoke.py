"""Each benchmark runs at its tiny `--quick` size and prints its table. No timing is checked: the numbers of
a shared CI machine mean nothing; what matters is that the benchmarks keep working as hasten changes.

The Accelerate columns appear only where the `bench` extra is installed; CI installs `test` only, and then
the benchmarks must leave Accelerate out cleanly.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HAS_ACCELERATE = importlib.util.find_spec("accelerate") is not None


def run_benchmark(*args, timeout=300):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HASTEN_", "ACCELERATE_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    result = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, f"{args} exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


def table_rows(text: str, title: str) -> list[list[str]]:
    """The body rows of the Markdown table under `### {title}...`, as lists of cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("### " + title))
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("### "):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and set(cells) != {"---"}:
            rows.append(cells)
    assert len(rows) >= 2, f"no table under {title!r}:\n{text}"
    return rows  # header first


def check_sides(header: list[str]):
    assert "raw torch" in header and "hasten" in header
    assert ("accelerate" in header) == HAS_ACCELERATE


def test_step_overhead_prints_every_configuration():
    out = run_benchmark("-m", "benchmarks.step_overhead", "--quick")
    header, *rows = table_rows(out, "Per-step overhead")
    check_sides(header)
    configs = {(r[0], r[1], r[2]) for r in rows}
    assert configs == {(m, p, ga) for m in ("tiny MLP", "small transformer") for p in ("fp32", "bf16") for ga in "14"}
    for row in rows:
        assert "s" in row[header.index("hasten")]  # a time, not a skip


def test_data_loader_runs_or_skips_hasten_with_a_reason():
    out = run_benchmark("benchmarks/data_loader.py", "--quick")  # also checks the file runs as a plain script
    header, *rows = table_rows(out, "Data loader overhead")
    check_sides(header)
    assert [r[0] for r in rows] == ["sequential", "shuffled"]
    if importlib.util.find_spec("hasten.data_loader") is None:
        assert "hasten skipped" in out


def test_ddp_throughput_reports_each_launcher():
    out = run_benchmark("-m", "benchmarks.ddp_throughput", "--quick")
    header, *rows = table_rows(out, "DDP throughput")
    expected = ["raw torch", "hasten"] + (["accelerate"] if HAS_ACCELERATE else [])
    assert [r[0] for r in rows] == expected
    assert all(float(r[1]) > 0 for r in rows)


def test_startup_times_imports_and_launches():
    out = run_benchmark("-m", "benchmarks.startup", "--quick", "--repeats", "1")
    _, *imports = table_rows(out, "Import time")
    assert any("from hasten import Accelerator" in r[0] for r in imports)
    assert any("import accelerate" in r[0] for r in imports) == HAS_ACCELERATE
    _, *launches = table_rows(out, "Launch time")
    assert [r[0] for r in launches] == ["torchrun", "hasten launch"] + (["accelerate launch"] if HAS_ACCELERATE else [])


def test_save_load_state_measures_against_the_disk(tmp_path):
    out = run_benchmark("-m", "benchmarks.save_load_state", "--quick", "--size-mb", "2", "--dir", str(tmp_path))
    header, *rows = table_rows(out, "Checkpoint I/O")
    names = [r[0] for r in rows]
    assert names[:2] == ["disk floor (one file)", "raw torch"]
    assert ("accelerate" in names) == HAS_ACCELERATE
    assert ("hasten" in names) == (importlib.util.find_spec("hasten.checkpointing") is not None)
    assert list(tmp_path.iterdir()) == []  # the checkpoints were deleted


def test_runner_writes_report_between_markers(tmp_path):
    report = tmp_path / "benchmarks.md"
    report.write_text("# Title\n\n<!-- benchmark results start -->\nold\n<!-- benchmark results end -->\n\nfooter\n")
    out = run_benchmark("-m", "benchmarks", "--quick", "--only", "data_loader", "--no-accelerate", "--output",
                        str(report))
    text = report.read_text()
    assert text.startswith("# Title") and text.rstrip().endswith("footer") and "old" not in text
    assert "python -m benchmarks --quick --only data_loader --no-accelerate" in text
    header, *_ = table_rows(text, "Data loader overhead")
    assert "accelerate" not in header and "Accelerate left out" in text
    assert "**torch**: " in text and "**cpu**: " in text
    assert "Data loader overhead" in text and "Data loader overhead" in out


def test_runner_rejects_unknown_benchmark():
    result = subprocess.run([sys.executable, "-m", "benchmarks", "--only", "nope"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and "unknown benchmark(s) nope" in result.stderr


def test_big_model_reports_the_three_rows():
    out = run_benchmark("-m", "benchmarks.big_model", "--quick")
    header, *rows = table_rows(out, "Big-model inference")
    check_sides(header)
    names = [r[0] for r in rows]
    assert names[0] == "meta init + load in RAM: time to first output"
    assert "half of the layers on disk: time to first output" in names
    assert names[-1] == "forward half on disk / all in RAM"
    assert rows[-1][header.index("hasten")].endswith("×") and rows[-1][header.index("raw torch")] == "—"
    assert "outputs of hasten and raw torch agree" in out


def test_sp_vs_ddp_prints_both_sides():
    out = run_benchmark("benchmarks/sp_vs_ddp.py", "--quick")
    header, *rows = table_rows(out, "Ulysses sp=2 vs DDP")
    assert {row[1] for row in rows} == {"ddp", "sp"} and all("failed" not in row[2] for row in rows), out


def test_remote_checkpoint_prints_both_comparisons():
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    out = run_benchmark("-m", "benchmarks.remote_checkpoint", "--quick")
    header, *rows = table_rows(out, "Save to s3://")
    assert [r[0] for r in rows] == ["hasten save_state to s3://", "s3fs put of the staged folder"]
    assert rows[1][header.index("ratio (put / side)")] == "1.000" and float(rows[0][3]) > 0
    header, *rows = table_rows(out, "Training loop blocked")
    assert [r[0] for r in rows] == ["async to s3://", "async to a local folder"] and float(rows[0][2]) > 0
    assert "load average" in out
