"""Issue 15's names that act across processes, checked on 2 real processes (gloo, CPU)."""

from launching import launch


def test_surface_names_on_two_processes(tmp_path):
    result = launch("surface_checks.py", tmp_path, flags=("--cpu",), timeout=300)
    assert result.stdout.count("surface checks passed") == 2, result.stdout + result.stderr
