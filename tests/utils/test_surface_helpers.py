"""Smaller names Accelerate users import: tqdm, grad scaler and autocast helpers, DataLoaderAdapter,
patch_optimizer_step, test_launch, FSDP helper functions that need no process group, old module paths."""

from __future__ import annotations

import importlib
import io
import sys

import pytest
import torch
from torch.utils.data import DataLoader

import hasten.utils as utils
from hasten.data_loader import DataLoaderAdapter
from hasten.launchers import test_launch as check_launch
from hasten.optimizer import patch_optimizer_step


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


# -- tqdm -----------------------------------------------------------------------------------------------------------
def test_tqdm_shows_on_a_terminal_and_iterates_everything(monkeypatch):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    out = FakeTerminal()
    bar = utils.tqdm(range(5), file=out, desc="work")
    assert not bar.disable
    assert list(bar) == [0, 1, 2, 3, 4]
    assert "work" in out.getvalue() and "5/5" in out.getvalue()


def test_tqdm_draws_into_logs_as_accelerate_and_is_quiet_when_switched_off(monkeypatch):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    pipe = io.StringIO()  # a log file or CI pipe: Accelerate's bars draw there too
    bar = utils.tqdm(range(3), file=pipe)
    assert not bar.disable and list(bar) == [0, 1, 2] and "3/3" in pipe.getvalue()
    quiet = io.StringIO()  # tqdm's own disable=None: terminals only
    bar = utils.tqdm(range(3), file=quiet, disable=None)
    assert bar.disable is True and list(bar) == [0, 1, 2] and quiet.getvalue() == ""
    assert utils.tqdm(range(3), file=FakeTerminal(), disable=True).disable is True
    for variable in ("HASTEN_DISABLE_PROGRESS_BARS", "TQDM_DISABLE"):
        with utils.patch_environment(**{variable: "1"}):
            assert utils.tqdm(range(3), file=FakeTerminal()).disable is True
    with utils.patch_environment(HASTEN_DISABLE_PROGRESS_BARS="0"):
        assert not utils.tqdm(range(3), file=FakeTerminal()).disable


def test_tqdm_refuses_a_bool_first():
    with pytest.raises(ValueError, match="main_process_only as a keyword"):
        utils.tqdm(True, range(3))


# -- precision helpers ---------------------------------------------------------------------------------------------
def test_grad_scaler_works_on_the_cpu():
    scaler = utils.get_grad_scaler(init_scale=8.0)
    assert scaler.is_enabled()  # Accelerate 1.15 hands CPU runs a CUDA scaler that disables itself
    loss = torch.tensor(2.0, requires_grad=True)
    assert scaler.scale(loss).item() == 16.0


def test_grad_scaler_for_fsdp_is_sharded():
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    from hasten.utils import DistributedType

    scaler = utils.get_grad_scaler(DistributedType.FSDP)
    assert isinstance(scaler, ShardedGradScaler) and scaler.is_enabled()  # made for this process's device


def test_mixed_precision_context_follows_the_state():
    from hasten import Accelerator

    with utils.get_mixed_precision_context_manager(native_amp=False):
        assert not torch.is_autocast_enabled("cpu")
    Accelerator(mixed_precision="bf16", cpu=True)
    a, b = torch.randn(2, 2), torch.randn(2, 2)
    with utils.get_mixed_precision_context_manager(native_amp=True):
        assert torch.is_autocast_enabled("cpu")
        assert (a @ b).dtype == torch.bfloat16
    assert (a @ b).dtype == torch.float32


# -- DataLoaderAdapter ----------------------------------------------------------------------------------------------
def test_data_loader_adapter_passes_for_its_loader():
    data = list(range(10))
    adapter = DataLoaderAdapter(data, batch_size=4)
    assert isinstance(adapter, DataLoader)
    assert adapter.batch_size == 4 and len(adapter) == 3
    assert [b.tolist() for b in adapter] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    with pytest.raises(AttributeError, match="use_stateful_dataloader=True"):
        adapter.state_dict()
    with pytest.raises(AttributeError):
        adapter.no_such_attribute


def test_stateful_adapter_needs_torchdata(monkeypatch):
    import hasten.core.availability as availability

    monkeypatch.setattr(availability, "is_torchdata_stateful_dataloader_available", lambda: False)
    with pytest.raises(ImportError, match="torchdata"):
        DataLoaderAdapter(list(range(4)), use_stateful_dataloader=True)


def test_stateful_adapter_wraps_a_stateful_dataloader():
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    adapter = DataLoaderAdapter(list(range(4)), use_stateful_dataloader=True, batch_size=2)
    assert isinstance(adapter.base_dataloader, stateful.StatefulDataLoader)
    assert [batch.tolist() for batch in adapter] == [[0, 1], [2, 3]]


# -- optimizer, launchers ------------------------------------------------------------------------------------------
def test_patch_optimizer_step_records_the_call():
    class Holder:
        pass

    holder = Holder()
    calls = []
    step = patch_optimizer_step(holder, lambda *a, **k: calls.append((a, k)) or "stepped")
    assert not hasattr(holder, "_accelerate_step_called")
    assert step(1, closure=None) == "stepped"
    assert holder._accelerate_step_called is True and calls == [((1,), {"closure": None})]


def test_test_launch_builds_the_state():
    state = check_launch()
    assert state.num_processes == 1 and state.process_index == 0


# -- FSDP helpers without a process group ----------------------------------------------------------------------------
def test_fsdp_name_and_parameter_helpers(monkeypatch):
    names = {"_orig_mod.blocks.0._checkpoint_wrapped_module.weight": 1, "head.bias": 2}
    assert utils.fsdp2_canonicalize_names(names) == {"blocks.0.weight": 1, "head.bias": 2}
    utils.enable_fsdp_ram_efficient_loading()
    assert utils.str_to_bool(__import__("os").environ["FSDP_CPU_RAM_EFFICIENT_LOADING"], to_bool=True)
    utils.disable_fsdp_ram_efficient_loading()
    assert not utils.str_to_bool(__import__("os").environ["FSDP_CPU_RAM_EFFICIENT_LOADING"], to_bool=True)
    monkeypatch.delenv("FSDP_CPU_RAM_EFFICIENT_LOADING")

    old = torch.nn.Linear(2, 2)
    new = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(old.parameters(), lr=0.1)
    mapping = {old.weight.data_ptr(): new.weight, old.bias.data_ptr(): new.bias}
    utils.fsdp2_switch_optimizer_parameters(optimizer, mapping)
    assert optimizer.param_groups[0]["params"][0] is new.weight
    with pytest.raises(KeyError, match="no replacement"):
        utils.fsdp2_switch_optimizer_parameters(torch.optim.SGD(old.parameters(), lr=0.1), {})
    assert utils.get_fsdp2_grad_scaler().is_enabled()


def test_fsdp_adapter_only_is_refused_with_fsdp1_and_per_rank_files():
    """adapter_only=True is built for FSDP2 with DCP (tests/commands/test_alias.py runs it with peft); FSDP1 and
    use_dcp=False are refused in one line, and a model that is not a PEFT model is saved whole (as in Accelerate)."""
    from types import SimpleNamespace

    from torch.distributed.fsdp import StateDictType

    from hasten.backends.fsdp import adapter
    from hasten.core.errors import NotSupportedYetError

    with pytest.raises(NotSupportedYetError, match="FSDP2 only"):
        adapter.check_supported(SimpleNamespace(fsdp_version=1), use_dcp=True)
    sharded = SimpleNamespace(fsdp_version=2, state_dict_type=StateDictType.SHARDED_STATE_DICT)
    with pytest.raises(NotSupportedYetError, match="use_dcp=False"):
        adapter.check_supported(sharded, use_dcp=False)
    adapter.check_supported(sharded, use_dcp=True)
    assert not adapter.is_peft_model(torch.nn.Linear(1, 1))


def test_fsdp_helpers_take_the_adapter_path_for_a_peft_model(monkeypatch, tmp_path):
    """save_fsdp_model / load_fsdp_model with adapter_only=True on a PeftModel go the adapter way (here a stand-in
    peft module in one process: FSDP1 is refused there in one line); adapter_only=False saves the whole model."""
    from types import ModuleType, SimpleNamespace

    from hasten.core.errors import NotSupportedYetError

    class PeftModel(torch.nn.Linear):
        pass

    fake_peft = ModuleType("peft")
    fake_peft.PeftModel = PeftModel
    monkeypatch.setitem(sys.modules, "peft", fake_peft)
    plugin, accelerator = SimpleNamespace(fsdp_version=1), SimpleNamespace(process_index=0)
    for call in (utils.save_fsdp_model, utils.load_fsdp_model):
        with pytest.raises(NotSupportedYetError, match="adapter_only=True is supported with FSDP2 only"):
            call(plugin, accelerator, PeftModel(1, 1), tmp_path, adapter_only=True)
    with pytest.raises(Exception) as error:  # the whole-model path, which needs a real plugin
        utils.save_fsdp_model(plugin, accelerator, PeftModel(1, 1), tmp_path, adapter_only=False)
    assert "adapter_only" not in str(error.value)


# -- old and alternative module paths --------------------------------------------------------------------------------
def test_memory_utils_warns_and_still_works():
    sys.modules.pop("hasten.memory_utils", None)
    with pytest.warns(FutureWarning, match="find_executable_batch_size"):
        module = importlib.import_module("hasten.memory_utils")
    assert module.find_executable_batch_size is utils.find_executable_batch_size


def test_commands_merge_runs_merge_weights(tmp_path, capsys):
    from hasten.commands.merge import merge_command, merge_command_parser

    from hasten.core.errors import CheckpointError

    args = merge_command_parser().parse_args([str(tmp_path / "missing"), str(tmp_path / "out")])
    with pytest.raises(CheckpointError, match="missing"):  # as Accelerate's merge_command, it raises; the CLI prints
        merge_command(args)


def test_utils_rich_needs_rich_switched_on(monkeypatch):
    monkeypatch.delenv("ACCELERATE_ENABLE_RICH", raising=False)
    sys.modules.pop("hasten.utils.rich", None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install \"hasten\[rich\]\""):
        importlib.import_module("hasten.utils.rich")


def test_the_accelerate_cli_path_is_the_hasten_command():
    from hasten.commands import accelerate_cli, cli

    assert accelerate_cli.main is cli.main


def test_import_hasten_stays_light():
    code = ("import sys, hasten; heavy = [m for m in ('tqdm', 'safetensors', 'yaml', 'psutil', 'hasten.utils', "
            "'hasten.core.availability') if m in sys.modules]; print(heavy)")
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_tqdm_is_callable_after_its_module_is_imported():
    importlib.import_module("hasten.utils.tqdm")  # Python then binds hasten.utils.tqdm to the module
    bar = utils.tqdm(range(2), file=io.StringIO())
    assert list(bar) == [0, 1]
    from hasten.utils.tqdm import tqdm

    assert callable(tqdm) and list(tqdm(range(1), file=io.StringIO())) == [0]
