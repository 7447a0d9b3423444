"""The last of Accelerate's issue-15 names: FSDP2 helper functions, state's shared-dict pieces,
CannotPadNestedTensorWarning, get_module_children_bottom_up, commands.utils, and the TPU/SageMaker refusals."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch

from launching import launch


def test_fsdp2_functions_on_two_processes(tmp_path):
    """fsdp2_apply_ac wraps blocks in CheckpointWrapper as Accelerate does (names carry `_checkpoint_wrapped_module.`,
    state_dict keys do not); prepare() under activation_checkpointing does the same, and its checkpoints load
    into a model without activation checkpointing and back."""
    result = launch("fsdp2_functions.py", tmp_path, timeout=300)
    assert result.stdout.count("fsdp2 functions ok") == 2, result.stdout
    assert result.stdout.count("bypass device map ok") == 2, result.stdout  # prepare() and a dispatched model
    assert result.stdout.count("activation checkpointing names ok") == 2, result.stdout
    # regional compilation through prepare(): in place under FSDP2, compile_regions' new tree under DDP
    assert result.stdout.count("regional compilation ok") == 2, result.stdout


def test_fsdp2_functions_refuse_an_accelerator_without_fsdp2():
    from hasten import Accelerator
    from hasten.core.errors import ConfigError
    from hasten.utils import fsdp2_apply_ac, fsdp2_prepare_model

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    for function in (fsdp2_prepare_model, fsdp2_apply_ac):
        with pytest.raises(ConfigError, match="FSDP2") as caught:
            function(accelerator, model)
        assert "\n" not in str(caught.value)
    assert isinstance(model.weight, torch.nn.Parameter) and not hasattr(model, "_fsdp_state")


class _Tied(torch.nn.Module):
    _tied_weights_keys = ["head.weight"]

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.head = torch.nn.Linear(3, 5, bias=False)
        self.head.weight = self.embed.weight


def _reallocate(module):
    """A param_init_fn that gives every direct parameter a new tensor (as materialising from meta does)."""
    for name, param in list(module.named_parameters(recurse=False)):
        setattr(module, name, torch.nn.Parameter(torch.full_like(param, 7.0)))
    return module


def test_ensure_weights_retied_keeps_ties_through_param_init():
    from hasten.utils import ensure_weights_retied

    model = _Tied()
    init = ensure_weights_retied(_reallocate, model, torch.device("cpu"))
    for module in (model.embed, model.head):  # FSDP1 calls param_init_fn module by module
        init(module)
    assert model.head.weight is model.embed.weight
    assert torch.all(model.embed.weight == 7.0)

    untied = _Tied()
    plain = ensure_weights_retied(_reallocate, untied, "cpu")
    _reallocate(untied.embed), _reallocate(untied.head)
    assert untied.head.weight is not untied.embed.weight  # what the wrapper prevents
    no_keys = torch.nn.Linear(2, 2)
    assert ensure_weights_retied(_reallocate, no_keys, "cpu") is _reallocate
    assert plain is not _reallocate


def test_state_shared_dict_pieces():
    from hasten.state import SharedDict, ThreadLocalSharedDict, do_nothing

    assert do_nothing() is None and do_nothing(1, key=2) is None
    assert SharedDict is dict  # one process-wide Borg dict: hasten runs no XLA threads

    class Holder:
        shared = ThreadLocalSharedDict()

    a, b = Holder(), Holder()
    a.shared["x"] = 1
    assert b.shared == {"x": 1} and Holder.shared is a.shared
    seen = {}
    thread = threading.Thread(target=lambda: seen.update(other=dict(Holder().shared)))
    thread.start(), thread.join()
    assert seen["other"] == {}  # another thread has its own dict
    b.shared = {"y": 2}
    assert a.shared == {"y": 2}


def test_pad_across_processes_warns_on_nested_tensors():
    from hasten.utils import CannotPadNestedTensorWarning, pad_across_processes
    from hasten.utils.operations import CannotPadNestedTensorWarning as same

    assert same is CannotPadNestedTensorWarning and issubclass(CannotPadNestedTensorWarning, UserWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own nested-tensor prototype warning
        nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    with pytest.warns(CannotPadNestedTensorWarning, match="nested"):
        out = pad_across_processes({"a": nested})
    assert out["a"] is nested
    with warnings.catch_warnings():
        warnings.simplefilter("error", CannotPadNestedTensorWarning)
        pad_across_processes(torch.ones(2))  # plain tensors: no warning


def test_get_module_children_bottom_up():
    from hasten.utils import get_module_children_bottom_up
    from hasten.utils.other import get_module_children_bottom_up as same

    assert same is get_module_children_bottom_up
    inner = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    model = torch.nn.Sequential(inner, torch.nn.Linear(2, 1))
    order = get_module_children_bottom_up(model)
    assert order == [inner[0], inner[1], inner, model[1], model]
    names = [name for name, _ in get_module_children_bottom_up(model, return_fqns=True)]
    assert names == ["0.0", "0.1", "0", "1", ""]


def test_custom_argument_parser_takes_both_spellings_and_records_given_options():
    from hasten.commands.utils import CustomArgumentParser

    parser = CustomArgumentParser(prog="x")
    parser.add_argument("--num_processes", type=int, default=1)
    parser.add_argument("--cpu", action="store_true")
    group = parser.add_argument_group("more")
    group.add_argument("--main_process_port", type=int, default=29500)
    args = parser.parse_args(["--num-processes", "1", "--main-process-port", "7"])
    assert (args.num_processes, args.main_process_port, args.cpu) == (1, 7, False)
    assert args.nondefault == {"num_processes", "main_process_port"}  # given, even at the default value
    args = parser.parse_args(["--cpu"])
    assert args.cpu is True and args.nondefault == {"cpu"}
    assert not hasattr(parser.parse_args([]), "nondefault")


def test_sagemaker_entry_point_refuses_in_one_line():
    # (prepare_tpu and install_xla are built: tests/commands/test_tpu.py and tests/xla/)
    from hasten.commands.config.sagemaker import get_sagemaker_input
    from hasten.core.errors import NotSupportedYetError

    with pytest.raises(NotSupportedYetError, match="SageMaker") as caught:
        get_sagemaker_input()
    assert "\n" not in str(caught.value) and isinstance(caught.value, NotImplementedError)


# -- names the regenerated public-names list added (issue 24) -----------------------------------------------------
def test_verify_and_chained_operation_on_one_process():
    import torch

    from hasten.core.errors import DistributedOperationException
    from hasten.utils.operations import chained_operation, verify_operation

    @verify_operation
    def total(tensor):
        return tensor.sum()

    assert total(torch.ones(3)) == 3 and total(tensor=torch.ones(2)) == 2 and total.__name__ == "total"

    @chained_operation
    def failing():
        raise DistributedOperationException("shapes differ")

    with pytest.raises(DistributedOperationException, match=r"^Error found while calling `.*failing`") as caught:
        failing()
    assert str(caught.value.__cause__) == "shapes differ"


def test_gather_tensor_shape_and_dtype_codes_on_one_process():
    import torch

    from hasten.utils.operations import TENSOR_INT_TO_DTYPE, TENSOR_TYPE_TO_INT, gather_tensor_shape

    shape, code = gather_tensor_shape(torch.zeros(2, 0, 5, dtype=torch.bfloat16))
    assert shape.tolist() == [2, 0, 5] and TENSOR_INT_TO_DTYPE[code] is torch.bfloat16
    assert TENSOR_TYPE_TO_INT[torch.float32] == 1 and len(TENSOR_INT_TO_DTYPE) == 10
    with pytest.raises(ValueError, match="no process passed a tensor"):
        gather_tensor_shape(None)


def test_check_device_same_treats_an_unindexed_accelerator_as_index_0():
    import torch

    from hasten.utils.modeling import check_device_same

    assert check_device_same(torch.device("cuda"), torch.device("cuda:0"))
    assert not check_device_same(torch.device("cuda"), torch.device("cuda:1"))
    assert not check_device_same(torch.device("cpu"), torch.device("cuda:0"))
    assert check_device_same(torch.device("cpu"), torch.device("cpu"))


def test_other_and_imports_leftovers(monkeypatch):
    import numpy as np
    import torch

    from hasten.utils import imports, other

    assert other.np_core.multiarray is not None
    with torch.serialization.safe_globals(other.TORCH_SAFE_GLOBALS):
        import io

        buffer = io.BytesIO()
        torch.save({"rng": np.random.get_state()}, buffer)
        buffer.seek(0)
        assert torch.load(buffer, weights_only=True)["rng"][0] == "MT19937"
    port = other.get_free_port()
    assert 0 < port < 65536 and not other.is_port_in_use(port)
    blocks = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]))
    assert other.has_repeated_blocks(blocks) and other.is_repeated_blocks(blocks[0])
    assert imports.is_numpy_available() and not imports.is_numpy_available("999.0")
    monkeypatch.setattr(imports, "USE_TORCH_XLA", False)
    assert imports.is_torch_xla_available() is False
