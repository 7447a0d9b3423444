"""fp8 training (issue 16): asking for it every way, the recipe handlers, the layer choice and conversion, MS-AMP refused.

fp8 matmuls need a CUDA GPU with compute capability >= 8.9; on any other machine every way of asking for fp8 must end
in one line naming the device and what is needed. The conversion logic (which Linear layers become fp8) is tested on
module trees; with torchao installed, its CPU emulation also runs the converted layers. GPU runs are in
tests/gpu/test_fp8_gpu.py.
"""

import warnings

import pytest
import torch
from launching import REPO, launch

from hasten import Accelerator
from hasten.core.availability import is_torchao_available, is_transformer_engine_available
from hasten.commands.launch import launch_command_parser, plan_launch
from hasten.config.fp8 import AORecipeKwargs, FP8RecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs
from hasten.core.enums import FP8BackendType
from hasten.core.errors import ConfigError, NotBuiltError
from hasten.training.fp8 import Fp8Recipe, support_problem
from hasten.state import AcceleratorState
from hasten.utils.ao import filter_first_and_last_linear_layers, find_first_last_linear_layers
from hasten.training.fp8.ao import layers_to_convert

FP8_GPU = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)
no_fp8_here = pytest.mark.skipif(FP8_GPU, reason="this machine can run fp8")
needs_torchao = pytest.mark.skipif(not is_torchao_available(), reason="torchao is not installed")


@pytest.fixture(autouse=True)
def clean(tmp_path, monkeypatch):
    import os

    for key in list(os.environ):
        if key.startswith(("HASTEN_", "ACCELERATE_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


class Tower(torch.nn.Module):
    """embed(32->64) -> blocks of Linear(64->64) and an odd Linear(64->24) -> head(24->16)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(32, 64)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.LayerNorm(64)) for _ in range(2)
        )
        self.odd = torch.nn.Linear(64, 24)
        self.head = torch.nn.Linear(24, 16)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.odd(x))


def _assert_one_fp8_line(message: str, device: str = "cpu"):
    assert "\n" not in message
    assert message.startswith("mixed_precision='fp8':")
    assert f"runs on {device!r}" in message and "compute capability >= 8.9" in message and "H100" in message
    if not is_torchao_available() and not is_transformer_engine_available():
        assert 'pip install "hasten[fp8]"' in message


# -- asking for fp8 without a capable GPU: one line, from every way in ------------------------------------------
@no_fp8_here
def test_accelerator_argument_refused_in_one_line_when_built():
    with pytest.raises(ConfigError) as caught:
        Accelerator(mixed_precision="fp8", cpu=True)
    _assert_one_fp8_line(str(caught.value))


@no_fp8_here
@pytest.mark.parametrize("variable", ["HASTEN_MIXED_PRECISION", "ACCELERATE_MIXED_PRECISION"])
def test_environment_variable_refused_in_one_line(variable, monkeypatch):
    monkeypatch.setenv(variable, "fp8")
    with pytest.raises(ConfigError) as caught:
        Accelerator(cpu=True)
    _assert_one_fp8_line(str(caught.value))


def _plan(*flags):
    return plan_launch(launch_command_parser().parse_args([*flags, "train.py"]))


def _write_config(tmp_path, text: str):
    path = tmp_path / "hf" / "hasten" / "default_config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


@no_fp8_here
def test_config_file_fp8_config_reaches_the_recipe_and_the_refusal(tmp_path, monkeypatch):
    path = _write_config(tmp_path, "distributed_type: NO\nmixed_precision: fp8\nfp8_config:\n  backend: AO\n"
                                   "  pad_inner_dim: false\n  enable_fsdp_float8_all_gather: false\n")
    exported = _plan("--config_file", path, "--cpu").settings.env  # named: --cpu alone skips the default file
    assert exported["HASTEN_MIXED_PRECISION"] == "fp8"
    assert exported["HASTEN_FP8_BACKEND"] == "ao"
    assert exported["HASTEN_FP8_PAD_INNER_DIM"] == "false"
    for key, value in exported.items():
        monkeypatch.setenv(key, value)
    handler = AORecipeKwargs()  # what the training process reads
    assert handler.pad_inner_dim is False and handler.enable_fsdp_float8_all_gather is False
    with pytest.raises(ConfigError) as caught:
        Accelerator(cpu=True)
    _assert_one_fp8_line(str(caught.value))


def test_config_file_te_keys_with_accelerate_spellings_reach_the_recipe(tmp_path, monkeypatch):
    # Accelerate's `accelerate config` writes amax_history_length / amax_compute_algorithm / override_linear_precision
    path = _write_config(tmp_path, "distributed_type: NO\nmixed_precision: fp8\nfp8_config:\n  backend: TE\n"
                                   "  fp8_format: E4M3\n  amax_history_length: 16\n  amax_compute_algorithm: max\n"
                                   "  margin: 2\n  override_linear_precision: [false, false, true]\n")
    for key, value in _plan("--config_file", path, "--cpu").settings.env.items():
        monkeypatch.setenv(key, value)
    handler = TERecipeKwargs()
    assert (handler.fp8_format, handler.amax_history_len, handler.amax_compute_algo, handler.margin) == (
        "E4M3", 16, "max", 2)
    assert handler.override_linear_precision == (False, False, True)


@no_fp8_here
def test_launched_script_stops_with_the_one_line():
    result = launch("fp8_refused.py", num_processes=1, check=False,
                    flags=["--cpu", "--mixed_precision", "fp8", "--fp8_backend", "ao", "--fp8_pad_inner_dim", "false"])
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if "mixed_precision='fp8'" in line]
    assert len(lines) == 1, result.stderr
    _assert_one_fp8_line(lines[0].split("error: ", 1)[-1])
    assert "Traceback" not in result.stderr


def test_the_message_names_the_gpu_found_and_what_is_needed():
    assert support_problem("cuda", (9, 0), "NVIDIA H100") is None
    old_gpu = support_problem("cuda", (8, 0), "NVIDIA A100-SXM4-80GB")
    assert "NVIDIA A100-SXM4-80GB" in old_gpu and "compute capability 8.0" in old_gpu and ">= 8.9" in old_gpu
    missing = support_problem("cuda", (8, 9), "NVIDIA L4", library_missing="AO")
    assert "torchao is not installed" in missing and 'pip install "hasten[fp8]"' in missing
    assert "transformer_engine is not installed" in support_problem("cuda", (9, 0), "H100", library_missing="TE")
    both = support_problem("mps", library_missing="AO")
    assert "runs on 'mps'" in both and "torchao is not installed" in both and "\n" not in both


# -- fp8 settings without fp8 are refused, not ignored ----------------------------------------------------------------
def test_recipe_handler_without_fp8_precision_is_refused():
    with pytest.raises(ConfigError, match="AORecipeKwargs was passed in kwargs_handlers but mixed_precision is 'no'"):
        Accelerator(cpu=True, kwargs_handlers=[AORecipeKwargs()])


def test_two_recipe_handlers_are_refused():
    with pytest.raises(ConfigError, match="pass one fp8 recipe handler, not AORecipeKwargs and TERecipeKwargs"):
        Accelerator(cpu=True, kwargs_handlers=[AORecipeKwargs(), TERecipeKwargs()])


def test_fp8_variable_without_fp8_precision_is_refused(monkeypatch):
    monkeypatch.setenv("ACCELERATE_FP8_MARGIN", "3")
    with pytest.raises(ConfigError, match="fp8_margin .from ACCELERATE_FP8_MARGIN. only applies to fp8 training"):
        Accelerator(cpu=True, mixed_precision="bf16")


def test_fp8_variables_at_their_defaults_are_harmless(monkeypatch):
    # Accelerate's launcher exports every fp8 variable with its default value
    for key, value in {"ACCELERATE_FP8_MARGIN": "0", "ACCELERATE_FP8_FORMAT": "HYBRID",
                       "ACCELERATE_FP8_PAD_INNER_DIM": "True", "ACCELERATE_FP8_OVERRIDE_FPROP": "False"}.items():
        monkeypatch.setenv(key, value)
    accelerator = Accelerator(cpu=True)
    assert accelerator.fp8_backend == FP8BackendType.NO and accelerator.fp8_enabled is False


def test_launcher_refuses_a_typed_fp8_flag_without_fp8():
    with pytest.raises(ConfigError, match="--fp8_margin only applies to fp8 training, but mixed_precision is 'bf16'"):
        _plan("--cpu", "--mixed_precision", "bf16", "--fp8_margin", "2")


def test_the_files_fp8_block_stays_home_when_a_flag_changes_the_precision(tmp_path):
    path = _write_config(tmp_path, "distributed_type: NO\nmixed_precision: fp8\nfp8_config:\n  backend: AO\n  margin: 2\n")
    exported = _plan("--config_file", path, "--cpu", "--mixed_precision", "bf16").settings.env
    assert exported["HASTEN_MIXED_PRECISION"] == "bf16"
    assert not any(key.startswith("HASTEN_FP8_") for key in exported)


# -- recipe handlers: Accelerate's fields, checked in one line -------------------------------------------------------
@pytest.mark.parametrize("kwargs,expected", [
    ({"fp8_format": "E6M1"}, "TERecipeKwargs(fp8_format='E6M1'): expected one of HYBRID, E4M3, E5M2"),
    ({"amax_compute_algo": "mean"}, "TERecipeKwargs(amax_compute_algo='mean'): expected one of max, most_recent"),
    ({"margin": -1}, "TERecipeKwargs(margin=-1): expected a whole number of 0 or more"),
    ({"interval": 0}, "TERecipeKwargs(interval=0): expected a whole number of 1 or more"),
    ({"amax_history_len": "long"}, "TERecipeKwargs(amax_history_len='long')"),
    ({"override_linear_precision": (True, False)}, "expected three comma-separated booleans"),
    ({"use_mxfp8_block_scaling": True, "amax_history_len": 16}, "cannot be combined with use_mxfp8_block_scaling"),
])
def test_te_recipe_bad_values_are_one_line_errors(kwargs, expected):
    with pytest.raises(ConfigError) as caught:
        TERecipeKwargs(**kwargs)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_te_recipe_defaults_and_normalisation_follow_accelerate():
    handler = TERecipeKwargs(fp8_format="e4m3", amax_compute_algo="MAX", override_linear_precision="true,false,no")
    assert (handler.fp8_format, handler.amax_compute_algo) == ("E4M3", "max")
    assert handler.override_linear_precision == (True, False, False)
    default = TERecipeKwargs()
    assert (default.use_autocast_during_eval, default.margin, default.interval, default.fp8_format,
            default.amax_history_len, default.amax_compute_algo, default.override_linear_precision,
            default.use_mxfp8_block_scaling) == (False, 0, 1, "HYBRID", 1024, "most_recent", (False,) * 3, False)
    assert TERecipeKwargs(margin=2).to_kwargs() == {"margin": 2}


def test_te_recipe_reads_accelerates_variables(monkeypatch):
    monkeypatch.setenv("ACCELERATE_FP8_AMAX_HISTORY_LEN", "32")
    monkeypatch.setenv("ACCELERATE_FP8_OVERRIDE_FPROP", "true")
    monkeypatch.setenv("ACCELERATE_FP8_OVERRIDE_WGRAD", "true")
    monkeypatch.setenv("ACCELERATE_FP8_INTERVAL", "3")
    monkeypatch.setenv("ACCELERATE_FP8_USE_AUTOCAST_DURING_EVAL", "true")
    handler = TERecipeKwargs()
    assert handler.amax_history_len == 32 and handler.override_linear_precision == (True, False, True)
    assert handler.interval == 3 and handler.use_autocast_during_eval is True
    monkeypatch.setenv("HASTEN_FP8_MARGIN", "lots")
    with pytest.raises(ConfigError, match="environment variable HASTEN_FP8_MARGIN='lots' is not valid for fp8_margin"):
        TERecipeKwargs()


def test_ao_recipe_fields_and_filter_check(monkeypatch):
    handler = AORecipeKwargs()
    assert handler.pad_inner_dim is True and handler.enable_fsdp_float8_all_gather is True
    assert (handler.config is not None) == is_torchao_available()
    monkeypatch.setenv("ACCELERATE_FP8_PAD_INNER_DIM", "false")
    assert AORecipeKwargs().pad_inner_dim is False
    chosen = AORecipeKwargs(pad_inner_dim=True, enable_fsdp_float8_all_gather=False)  # the code beats the variable
    assert chosen.pad_inner_dim is True and chosen.enable_fsdp_float8_all_gather is False
    if is_torchao_available():  # and the torchao config built from them
        assert (chosen.config.pad_inner_dim, chosen.config.enable_fsdp_float8_all_gather) == (True, False)
    given = object()  # the user's own Float8LinearConfig is the one used, nothing is built from the variables
    assert AORecipeKwargs(config=given).config is given
    with pytest.raises(ConfigError, match="module_filter_func=3. must be a function"):
        AORecipeKwargs(module_filter_func=3)
    with pytest.raises(ConfigError, match="AORecipeKwargs.pad_inner_dim='maybe'."):
        AORecipeKwargs(pad_inner_dim="maybe")


# -- MS-AMP: refused everywhere, with what to use instead ------------------------------------------------------------
def test_msamp_is_refused_everywhere(monkeypatch):
    with pytest.raises(NotBuiltError, match="MS-AMP is no longer maintained; use AORecipeKwargs"):
        MSAMPRecipeKwargs()
    with pytest.raises(NotBuiltError, match="MS-AMP"), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        FP8RecipeKwargs(backend="msamp")
    with pytest.raises(NotBuiltError, match="--fp8_backend: MS-AMP fp8 .fp8_backend msamp. is not built"):
        _plan("--cpu", "--mixed_precision", "fp8", "--fp8_backend", "msamp")
    with pytest.raises(NotBuiltError, match="--fp8_opt_level: MS-AMP fp8 is not built"):
        _plan("--cpu", "--mixed_precision", "fp8", "--fp8_opt_level", "O1")
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "MSAMP")
    with pytest.raises(NotBuiltError, match="environment variable ACCELERATE_FP8_BACKEND.*MS-AMP"):
        Accelerator(cpu=True, mixed_precision="fp8")


def test_the_older_spelling_maps_to_transformer_engine():
    with pytest.warns(FutureWarning, match="FP8RecipeKwargs is deprecated"):
        handler = FP8RecipeKwargs(margin=1)
    assert handler.backend == "TE" and handler.margin == 1 and isinstance(handler, TERecipeKwargs)
    with pytest.raises(ConfigError, match="takes backend 'te' only"), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        FP8RecipeKwargs(backend="ao")


# -- which layers become fp8 (no library needed) ---------------------------------------------------------------------
def test_default_filter_keeps_first_last_and_odd_layers_in_high_precision():
    model = Tower()
    assert find_first_last_linear_layers(model) == ("embed", "head")
    # embed and head stay (first/last); odd (64->24) stays (24 is not a multiple of 16)
    assert layers_to_convert(model) == ["blocks.0.0", "blocks.1.0"]
    # passed as the filter, Accelerate's name is bound to the model (torchao calls it with single layers)
    assert layers_to_convert(model, filter_first_and_last_linear_layers) == ["blocks.0.0", "blocks.1.0"]
    assert layers_to_convert(model, lambda module, fqn: fqn != "blocks.1.0") == ["embed", "blocks.0.0", "odd", "head"]
    assert find_first_last_linear_layers(torch.nn.ReLU()) == (None, None)


def test_filter_first_and_last_on_a_whole_model_answers_for_that_model():
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 16))
    answers = {name: filter_first_and_last_linear_layers(model, name) for name in ("0", "1", "2")}
    assert answers == {"0": False, "1": True, "2": False}


@pytest.mark.skipif(is_torchao_available(), reason="torchao is installed")
def test_torchao_helpers_without_torchao_give_the_install_hint():
    from hasten.utils.ao import convert_model_to_fp8_ao, has_ao_layers

    for call in (lambda: has_ao_layers(Tower()), lambda: convert_model_to_fp8_ao(Tower())):
        with pytest.raises(ImportError, match='pip install "hasten.training.fp8."'):
            call()


@pytest.mark.skipif(is_transformer_engine_available(), reason="transformer_engine is installed")
def test_transformer_engine_helpers_without_it_say_so():
    from hasten.utils.transformer_engine import apply_fp8_autowrap, has_transformer_engine_layers

    with pytest.raises(ImportError, match="needs transformer_engine.*--fp8_backend ao"):
        has_transformer_engine_layers(Tower())
    with pytest.raises(ImportError, match="needs transformer_engine"):
        apply_fp8_autowrap(Tower(), None)


# -- the torchao swap itself (torchao installed; its matmuls are emulated on CPU) -------------------------------------
@needs_torchao
def test_convert_model_to_fp8_ao_swaps_exactly_the_chosen_layers():
    from torchao.float8.float8_linear import Float8Linear

    from hasten.utils.ao import convert_model_to_fp8_ao, has_ao_layers

    model = Tower()
    assert not has_ao_layers(model)
    convert_model_to_fp8_ao(model)
    swapped = sorted(name for name, module in model.named_modules() if isinstance(module, Float8Linear))
    assert swapped == ["blocks.0.0", "blocks.1.0"] and has_ao_layers(model)
    assert type(model.embed) is torch.nn.Linear and type(model.odd) is torch.nn.Linear


@needs_torchao
def test_optimizer_built_before_conversion_trains_the_converted_layers():
    """With Accelerate's default config (float8 all-gather on) the converted weights become new parameters, so an
    optimizer built before `prepare` (the usual order) would update orphans; hasten re-points it."""
    torch.manual_seed(0)
    model = Tower()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    recipe = Fp8Recipe("AO", AORecipeKwargs())
    assert recipe.handler.config.enable_fsdp_float8_all_gather
    recipe.convert([model], fsdp2=True)  # FSDP2 keeps the all-gather, so the weights are new parameter objects
    recipe.repoint(optimizer)  # what prepare_optimizer does for an optimizer prepared after the model
    params = {id(p) for p in model.parameters()}
    assert all(id(p) in params for group in optimizer.param_groups for p in group["params"])
    before = model.blocks[0][0].weight.detach().clone()
    model(torch.randn(8, 32)).pow(2).mean().backward()
    optimizer.step()
    assert not torch.equal(before, model.blocks[0][0].weight.detach())


@needs_torchao
def test_without_fsdp2_the_weights_stay_plain_parameters():
    model = Tower()
    originals = [p for p in model.parameters()]
    Fp8Recipe("AO", AORecipeKwargs()).convert([model], fsdp2=False)
    assert all(a is b for a, b in zip(originals, model.parameters()))
    assert all(type(p.data) is torch.Tensor for p in model.parameters())


@no_fp8_here
def test_benchmark_says_why_it_cannot_run_here():
    import subprocess
    import sys

    script = REPO / "benchmarks" / "fp8_vs_bf16.py"
    result = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "needs a CUDA GPU with compute capability >= 8.9" in result.stderr and "Traceback" not in result.stderr


def _fsdp_plan(plugin):
    """The run plan of a one-process CPU run with this FSDP plugin (the backend is built from a plan)."""
    from hasten.core.enums import DistributedType
    from hasten.plan import Cluster, make_run_plan

    return make_run_plan(cluster=lambda _fsdp_plugin: Cluster(1, "cpu", DistributedType.NO), fsdp_plugin=plugin)


@needs_torchao
def test_fsdp2_ram_efficient_loading_fills_the_fp8_layers_with_rank0s_weights():
    """Accelerate refuses fp8 (torchao) with FSDP2 cpu_ram_efficient_loading, which `--use_fsdp` turns on by default;
    hasten swaps the layers in on every rank's model (real on rank 0, meta elsewhere) and streams rank 0's weights
    out of the fp8 wrappers (docs/differences.md)."""
    result = launch("fp8_ram_efficient.py", num_processes=2, timeout=300)
    assert result.stdout.count("fp8 layers hold rank 0's weights and train") == 2, result.stdout + result.stderr


@needs_torchao
def test_fsdp2_float8_all_gather_trains_the_sharded_fp8_layers():
    """The FSDP2 path of `prepare` on one CPU process (torchao emulates the fp8 matmul): convert with the float8
    all-gather on, shard, re-point the optimizer, and train; the scales are recomputed after each step."""
    import torch.distributed as dist

    from hasten.backends.fsdp.backend import FSDPBackend
    from hasten.config.fsdp import FullyShardedDataParallelPlugin
    from hasten.training.precision import PrecisionPolicy

    state = AcceleratorState(cpu=True, _from_accelerator=True)  # the Accelerator refuses fp8 on a CPU
    policy = PrecisionPolicy(mode="no", fp8=Fp8Recipe("AO", AORecipeKwargs()))
    backend = FSDPBackend(state, _fsdp_plan(FullyShardedDataParallelPlugin(fsdp_version=2)), precision=policy)
    torch.manual_seed(0)
    model = Tower()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        policy.convert_models([model], [optimizer], fsdp2=True)
        backend.prepare_together([model], [optimizer])
        layer = model.blocks[0][0]
        assert type(layer).__name__ == "Float8Linear" and type(layer.weight).__name__ == "DTensor"
        before = layer.weight.full_tensor().clone()
        for _ in range(2):
            model(torch.randn(8, 32)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        assert not torch.equal(before, layer.weight.full_tensor())
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_te_recipe_arguments_are_the_fields_set_away_from_the_defaults():
    from hasten.training.fp8.te import recipe_kwargs

    assert recipe_kwargs(TERecipeKwargs()) == {}
    handler = TERecipeKwargs(fp8_format="E4M3", margin=1, amax_history_len=16, override_linear_precision="0,0,1",
                             use_autocast_during_eval=True)
    assert recipe_kwargs(handler) == {"fp8_format": "E4M3", "margin": 1, "amax_history_len": 16,
                                      "override_linear_precision": (False, False, True)}


def test_te_forward_wrapper_runs_fp8_in_training_only(monkeypatch):
    """The wrapper's own logic, with a stand-in for TE's `fp8_autocast` (TransformerEngine needs CUDA)."""
    import contextlib
    import sys
    import types
    from types import MethodType

    from hasten.training.fp8.te import _Fp8AutocastForward

    seen = []
    stand_in = types.ModuleType("transformer_engine.pytorch")
    stand_in.fp8_autocast = lambda enabled, fp8_recipe: seen.append((enabled, fp8_recipe)) or contextlib.nullcontext()
    monkeypatch.setitem(sys.modules, "transformer_engine", types.ModuleType("transformer_engine"))
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", stand_in)
    for use_during_eval, expected in ((False, [(True, "recipe"), (False, "recipe")]),
                                      (True, [(True, "recipe"), (True, "recipe")])):
        model, seen[:] = Tower(), []
        original = model.forward
        model.forward = MethodType(_Fp8AutocastForward(model.forward, "recipe", use_during_eval), model)
        assert model.forward.__func__.__wrapped__ == original
        x = torch.randn(2, 32)
        assert torch.equal(model(x), original(x))
        model.eval()
        model(x)
        assert seen == expected


@needs_torchao
def test_a_model_converted_before_prepare_is_not_converted_twice():
    from torchao.float8.float8_linear import Float8Linear

    from hasten.utils.ao import convert_model_to_fp8_ao

    model = convert_model_to_fp8_ao(Tower(), module_filter_func=lambda module, fqn: fqn == "blocks.0.0")
    Fp8Recipe("AO", AORecipeKwargs()).convert([model])
    assert [n for n, m in model.named_modules() if isinstance(m, Float8Linear)] == ["blocks.0.0"]
    assert type(model.blocks[0][0].weight) is torch.nn.Parameter and type(model.blocks[0][0]) is Float8Linear
