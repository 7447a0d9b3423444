"""CI's share of the mutation proof (docs/honoured.md): a rotating sample of the acceptance matrix's entries, each
dropped by its mutant, must each make one of its mapped tests fail (scripts/prove_honoured.py).

The sample turns over with the date (UTC), so day by day CI covers the whole table; it keeps to a budget using
the seconds each mutant took in the last full run (the table in docs/honoured.md). Entries listed in
NOT_YET_PROVEN (tests/acceptance_map.py) are left out until a test kills them.
"""

import datetime
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SAMPLE = 40
BUDGET_S = 60  # mutant seconds, recorded: the baselines, startup and collection come on top (about 3 minutes in all)


@pytest.mark.timeout(900)  # its own run has a 600 s bound; the suite's 300 s default cut it off on a loaded machine
def test_a_rotating_sample_of_mutants_is_killed():
    seed = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    command = [sys.executable, "scripts/prove_honoured.py", "--sample", str(SAMPLE), "--seed", seed,
               "--budget", str(BUDGET_S), "--times", "docs/honoured.md", "--timeout", "600"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    assert done.returncode == 0, f"seed {seed}: {summary}\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
    count = int(summary.split()[0])
    assert count >= SAMPLE, f"seed {seed}: only {count} entries fit the budget: {summary}"


def test_other_kinds_expand_and_keep_their_sections_out_of_the_samples_seconds(tmp_path):
    """`--kind spelling` makes one mutant per variable name of a row with several; the default and spelling runs
    write their own sections of docs/honoured.md, which a later drop run keeps and the sample's budget ignores."""
    sys.path.insert(0, str(REPO / "scripts"))
    import prove_honoured

    spelled = prove_honoured.mutants(["setting:log_level", "setting:num_machines", "param:prepare:args"], "spelling",
                                     named=True)
    assert spelled == ["setting:log_level~HASTEN_LOG_LEVEL", "setting:log_level~ACCELERATE_LOG_LEVEL"]
    assert prove_honoured.target(spelled[1])[::3] == ["spelling", "log_level"]
    assert prove_honoured.mutants(["setting:debug", "param:prepare:args"], "default", named=False) == ["setting:debug"]

    def row(seconds):
        return {"status": "killed", "test": "tests/x.py::test_y", "seconds": seconds, "message": ""}

    table = str(tmp_path / "honoured.md")
    prove_honoured.write_table(table, {"setting:debug": row(2.0)})
    prove_honoured.write_section(table, {"setting:debug~HASTEN_DEBUG_MODE": row(9.0)}, "spelling")
    prove_honoured.write_section(table, {"setting:debug": row(7.0)}, "default")
    prove_honoured.write_section(table, {"setting:debug": row(8.0)}, "default")  # a rerun replaces its section
    prove_honoured.write_table(table, {"setting:debug": row(3.0)})
    text = Path(table).read_text()
    assert text.count("<!-- mutants: spelling -->") == text.count("<!-- mutants: default -->") == 1
    assert "| 8.0 |" in text and "| 7.0 |" not in text
    assert prove_honoured.recorded_seconds(table) == {"setting:debug": 3.0}
