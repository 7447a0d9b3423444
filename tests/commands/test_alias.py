"""`hasten alias`: `import accelerate` gives hasten's own module objects, reversibly, in one environment only.

Every test installs the alias into a throwaway virtual environment in its tmp dir (made with --without-pip,
~0.1 s) that sees the project's packages through a .pth line; the project's own environment is never changed.
"""

from __future__ import annotations

import os
import re
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from hasten.commands import alias
from launching import SCRIPTS

DISTRIBUTED = SCRIPTS


def make_venv(path: Path):
    """A bare venv whose interpreter also sees this interpreter's site-packages (torch, hasten, transformers)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    site_dir = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip())
    project_sites = [p for p in site.getsitepackages() if os.path.isdir(p)]
    # hasten from this checkout first: the environment's editable install may point at another worktree
    source = str(Path(alias.__file__).resolve().parents[2])
    (site_dir / "_hasten_test_project.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in project_sites)
        + f"import sys; sys.path.insert(0, {source!r})\n")
    return python, site_dir


def run(program, *args, check=True, cwd=None, timeout=120):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HASTEN_", "ACCELERATE_", "PYTHON"))}
    result = subprocess.run([str(program), *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd,
                            timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{args} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="module")
def aliased(tmp_path_factory):
    """One venv with the alias installed, shared by the read-only tests of this module."""
    if alias._real_accelerate() is not None:
        pytest.skip(f"a real Accelerate is installed in this environment ({alias._real_accelerate()}); "
                    "the alias refuses to run next to it")
    python, site_dir = make_venv(tmp_path_factory.mktemp("aliased") / "venv")
    run(python, "-m", "hasten", "alias", "install")
    return python, site_dir


def test_accelerate_names_are_hastens_own_objects(aliased):
    python, _ = aliased
    script = """
import sys, importlib.metadata as md, importlib.util
assert "hasten" not in sys.modules and "torch" not in sys.modules, "the hook imports nothing at start-up"
import accelerate, hasten
import accelerate.utils, accelerate.state, accelerate.commands.launch
import hasten.utils, hasten.state, hasten.commands.launch
assert accelerate.utils is hasten.utils and accelerate.state is hasten.state
assert accelerate.__version__ == "1.15.0+hasten" != hasten.__version__, accelerate.__version__
from packaging import version
assert version.parse(accelerate.__version__) > version.parse("1.3.0")  # as transformers' Trainer compares it
assert accelerate.PartialState is hasten.PartialState and "Accelerator" in dir(accelerate)
accelerate.hasten_alias_probe = 1  # set through the view: lands on hasten (mock.patch relies on it)
assert hasten.hasten_alias_probe == 1
del accelerate.hasten_alias_probe
assert not hasattr(hasten, "hasten_alias_probe")
from accelerate import *  # noqa: F403 - the star import follows hasten's __all__
assert Accelerator is hasten.Accelerator
assert accelerate.commands.launch is hasten.commands.launch
from accelerate import Accelerator, PartialState
from accelerate.utils import gather, set_seed
assert Accelerator is hasten.Accelerator and gather is hasten.utils.gather
assert sys.modules["accelerate.utils"] is sys.modules["hasten.utils"]
assert md.version("accelerate") == "1.15.0+hasten", md.version("accelerate")
assert importlib.util.find_spec("accelerate") is not None
try:
    import accelerate.no_such_module
except ModuleNotFoundError as error:
    assert "accelerate.no_such_module" in str(error)
else:
    raise AssertionError("a module hasten lacks was found")
print("ALIAS-OK")
"""
    assert "ALIAS-OK" in run(python, "-c", script).stdout
    status = run(python, "-m", "hasten", "alias", "status").stdout
    assert status.startswith("accelerate alias: active") and "1.15.0+hasten" in status


def test_aliased_modules_keep_their_own_spec_so_relative_imports_do_not_warn(aliased):
    # The import system stamps the alias's spec on the module object it is handed; hasten.X then had
    # __package__ "hasten.X" but __spec__.parent "accelerate.X", and every relative import inside a function
    # warned (transformers' Trainer counts the warnings of a call and saw 4, not 1).
    python, _ = aliased
    script = """
import warnings
import accelerate.utils, accelerate.utils.operations, accelerate.state, accelerate
import hasten.utils
for name in ("accelerate.utils", "accelerate.utils.operations", "accelerate.state"):
    module = __import__(name, fromlist=["_"])
    assert module.__spec__.name == module.__name__, (name, module.__spec__.name, module.__name__)
    assert module.__spec__.parent == module.__package__, (name, module.__spec__.parent, module.__package__)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    exec("from .operations import gather", vars(accelerate.utils))  # a function-level relative import
assert not [w for w in caught if issubclass(w.category, ImportWarning)], [str(w.message) for w in caught]
print("SPEC-OK")
"""
    assert "SPEC-OK" in run(python, "-W", "error::ImportWarning", "-c", script).stdout


def test_accelerates_logger_names_are_hastens_loggers(aliased):
    # Accelerate's own tests (and users' scripts) capture or silence records by Accelerate's logger names.
    python, _ = aliased
    script = """
import logging, unittest
before = logging.getLogger("accelerate.utils.environment")  # made before the alias: a logger of its own
assert before.name == "accelerate.utils.environment"
import accelerate.utils
assert logging.getLogger("accelerate") is logging.getLogger("hasten")
assert logging.getLogger("accelerate.utils.environment") is logging.getLogger("hasten.utils.environment")
assert logging.getLogger("accelerated") is not logging.getLogger("hastend")  # only the package's own names
case = unittest.TestCase()
with case.assertLogs("accelerate.utils.environment", level="WARNING") as captured:
    assert accelerate.utils.convert_dict_to_env_variables({"A": "1", "B": "<x"}) == ["A=1\\n"]
assert len(captured.records) == 1, captured.output
print("LOGGERS-OK")
"""
    assert "LOGGERS-OK" in run(python, "-c", script).stdout


def test_hasten_env_shows_the_alias(aliased, tmp_path):
    python, _ = aliased
    assert "`accelerate` alias: active: `import accelerate` loads hasten" in run(python, "-m", "hasten", "env").stdout
    python, _ = make_venv(tmp_path / "plain")
    assert "`accelerate` alias: not installed" in run(python, "-m", "hasten", "env").stdout


def test_the_project_environment_is_never_changed(aliased):
    assert not os.path.exists(os.path.join(sysconfig.get_path("purelib"), alias.PTH_FILE))
    assert not any(type(f).__name__ == "AccelerateAliasFinder" for f in sys.meta_path)
    assert alias.alias_status().startswith(("not installed", "inactive"))


def test_remove_undoes_everything(tmp_path):
    if alias._real_accelerate() is not None:
        pytest.skip("a real Accelerate is installed in this environment")
    python, site_dir = make_venv(tmp_path / "venv")
    before = set(os.listdir(site_dir))
    run(python, "-m", "hasten", "alias", "install")
    run(python, "-c", "import accelerate")  # leaves a compiled hook in __pycache__, which remove also deletes
    assert (python.parent / "accelerate").exists() and (python.parent / "accelerate-launch").exists()
    assert "Removed the accelerate alias" in run(python, "-m", "hasten", "alias", "remove").stdout
    assert set(os.listdir(site_dir)) - {"__pycache__"} == before
    assert not (python.parent / "accelerate").exists() and not (python.parent / "accelerate-launch").exists()
    assert not os.listdir(site_dir / "__pycache__") if (site_dir / "__pycache__").exists() else True
    gone = run(python, "-c", "import accelerate", check=False)
    assert gone.returncode != 0 and "No module named 'accelerate'" in gone.stderr
    assert "not installed" in run(python, "-m", "hasten", "alias", "status").stdout
    assert "No alias in" in run(python, "-m", "hasten", "alias", "remove").stdout


def test_pip_uninstall_accelerate_removes_the_alias_too(tmp_path):
    pytest.importorskip("pip")
    if alias._real_accelerate() is not None:
        pytest.skip("a real Accelerate is installed in this environment")
    python, site_dir = make_venv(tmp_path / "venv")
    run(python, "-m", "hasten", "alias", "install")
    run(python, "-m", "pip", "uninstall", "-y", "--disable-pip-version-check", "accelerate")
    assert not {alias.PTH_FILE, alias.HOOK_FILE} & set(os.listdir(site_dir))
    assert not (python.parent / "accelerate").exists()
    assert run(python, "-c", "import accelerate", check=False).returncode != 0


def fake_real_accelerate(site_dir: Path):
    (site_dir / "accelerate").mkdir()
    (site_dir / "accelerate" / "__init__.py").write_text("REAL = True\n")
    (site_dir / "accelerate-1.15.0.dist-info").mkdir()
    (site_dir / "accelerate-1.15.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: accelerate\nVersion: 1.15.0\n")


def test_refuses_next_to_a_real_accelerate(tmp_path):
    python, site_dir = make_venv(tmp_path / "venv")
    fake_real_accelerate(site_dir)
    refused = run(python, "-m", "hasten", "alias", "install", check=False)
    assert refused.returncode == 1
    assert len(refused.stderr.strip().splitlines()) == 1 and "a real Accelerate is installed here" in refused.stderr
    assert alias.PTH_FILE not in os.listdir(site_dir)
    kept = run(python, "-m", "hasten", "alias", "remove", check=False)
    assert kept.returncode == 1 and "belongs to a real Accelerate" in kept.stderr
    assert (site_dir / "accelerate-1.15.0.dist-info" / "METADATA").exists()
    assert "inactive: a real Accelerate is installed" in run(python, "-m", "hasten", "alias", "status").stdout


def test_a_real_accelerate_installed_later_wins_over_the_alias(tmp_path):
    if alias._real_accelerate() is not None:
        pytest.skip("a real Accelerate is installed in this environment")
    python, site_dir = make_venv(tmp_path / "venv")
    run(python, "-m", "hasten", "alias", "install")
    (site_dir / "accelerate").mkdir()
    (site_dir / "accelerate" / "__init__.py").write_text("REAL = True\n")
    assert run(python, "-c", "import accelerate; print(accelerate.REAL)").stdout.strip() == "True"
    assert "inactive" in run(python, "-m", "hasten", "alias", "status").stdout


# -- real programs through the alias, on 2 processes -------------------------------------------------------------

def launch_in(python, script, *args, cwd, accelerate_command=False):
    """`python -m hasten launch` (or the `accelerate launch` console command) on 2 processes."""
    launcher = [python.parent / "accelerate", "launch"] if accelerate_command else [python, "-m", "hasten", "launch"]
    command = [*launcher, "--num_processes", "2", str(DISTRIBUTED / script), *map(str, args)]
    result = run(*command, check=False, cwd=cwd, timeout=300)
    assert result.returncode == 0, f"{script} failed\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    # found anywhere, not at line starts: two unbuffered processes may interleave a line and its newline
    passed = sorted(re.findall(r"CHECKS-PASSED (\d+) ", result.stdout))
    assert passed == ["0", "1"], result.stdout
    return result


def transformers_blocker(python) -> str | None:
    """Why transformers cannot run on hasten yet (the first name it imports that hasten lacks), or None."""
    probe = run(python, "-c", "from transformers import GPT2LMHeadModel, Trainer, TrainingArguments", check=False)
    if probe.returncode == 0:
        return None
    lines = [line for line in probe.stderr.splitlines() if "Error" in line]
    return lines[-2] if len(lines) > 1 else (lines[-1] if lines else probe.stderr[-300:])


def test_an_accelerate_script_runs_unchanged_on_two_processes(aliased, tmp_path):
    python, _ = aliased
    # the command line is Accelerate's too: `accelerate launch` is the console command the alias installed
    launch_in(python, "alias_no_trainer.py", tmp_path / "out", cwd=tmp_path, accelerate_command=True)
    assert (tmp_path / "out" / "final" / "model.safetensors").exists()


@pytest.fixture(scope="module")
def with_transformers(aliased):
    pytest.importorskip("transformers", reason='transformers is needed: pip install "hasten[alias-test]"')
    python, _ = aliased
    blocker = transformers_blocker(python)
    # every name transformers imports at start-up exists now: a missing one is a regression, not a skip
    assert blocker is None, f"transformers cannot import on hasten: {blocker}"
    return python


def test_a_transformers_no_trainer_script_runs_unchanged(with_transformers, tmp_path):
    launch_in(with_transformers, "alias_no_trainer.py", tmp_path / "out", "--model", "tiny-gpt2", cwd=tmp_path)


def test_transformers_trainer_trains_and_saves_on_two_processes(with_transformers, tmp_path):
    launch_in(with_transformers, "alias_trainer.py", tmp_path / "out", cwd=tmp_path)
    assert (tmp_path / "out" / "checkpoint-6" / "model.safetensors").exists()


# trl and peft are not hasten's dependencies: scripts/test.sh installs them without their dependencies (both ask
# for Accelerate, which the alias stands in for; a real one would shadow nothing but refuse the alias). They import
# `accelerate` at import time, so they are found here, not imported: the aliased venv imports them.
def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def test_trl_dpo_steps_on_two_processes(with_transformers, tmp_path):
    if not _installed("trl") or not _installed("datasets"):
        pytest.skip("trl and datasets are needed: bash scripts/test.sh installs them (pip install --no-deps trl)")
    launch_in(with_transformers, "alias_trl_dpo.py", tmp_path / "out", cwd=tmp_path)


def test_peft_fsdp_auto_wrap_policy_on_two_processes(with_transformers, tmp_path):
    if not _installed("peft"):
        pytest.skip("peft is needed: bash scripts/test.sh installs it (pip install --no-deps peft)")
    python = with_transformers
    command = [python, "-m", "hasten", "launch", "--use_fsdp", "--fsdp_version", "1", "--num_processes", "2",
               str(DISTRIBUTED / "alias_peft_fsdp.py")]
    result = run(*command, check=False, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    assert sorted(re.findall(r"CHECKS-PASSED (\d+) ", result.stdout)) == ["0", "1"], result.stdout


def test_peft_adapter_only_fsdp2_save_and_load_on_two_processes(with_transformers, tmp_path):
    """save_fsdp_model(adapter_only=True) writes only the LoRA weights (whole file and DCP folder); a fresh PEFT
    model loads them back identical, its base weights untouched."""
    if not _installed("peft"):
        pytest.skip("peft is needed: bash scripts/test.sh installs it (pip install --no-deps peft)")
    command = [with_transformers, "-m", "hasten", "launch", "--use_fsdp", "--fsdp_version", "2", "--num_processes",
               "2", str(DISTRIBUTED / "alias_peft_adapter_only.py"), str(tmp_path / "out")]
    result = run(*command, check=False, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    assert sorted(re.findall(r"CHECKS-PASSED (\d+) ", result.stdout)) == ["0", "1"], result.stdout
