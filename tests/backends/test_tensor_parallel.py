"""Tensor parallelism: the plans (automatic, the model's, the user's) in this process; training, checkpoints across
layouts and the rank properties in real processes (tests/workers/tp_layouts.py, tp_grid.py, tp_resume_one.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from hasten.core.errors import ConfigError
from hasten.distributed.tp_plan import automatic_plan, get_model_tp_size, model_has_dtensor, plan_for, resolve_plan
from launching import SCRIPTS, launch

sys.path.insert(0, str(SCRIPTS))
from tp_common import TinyGPT  # noqa: E402


def _one_line(error) -> str:
    text = str(error.value)
    assert "\n" not in text, text
    return text


def test_the_automatic_plan_of_a_plain_transformer():
    plan, heads = automatic_plan(TinyGPT(), 2)
    for i in (0, 1):
        for name in ("q_proj", "k_proj", "v_proj"):
            assert plan[f"blocks.{i}.attn.{name}"] == "colwise"
        assert plan[f"blocks.{i}.attn.o_proj"] == "rowwise"
        assert plan[f"blocks.{i}.mlp.fc1"] == "colwise" and plan[f"blocks.{i}.mlp.fc2"] == "rowwise"
        assert heads[(f"blocks.{i}.attn", "n_heads")] == 2
    assert plan["embed"] == "rowwise" and plan["head"] == "colwise_rep"
    assert not any("norm" in name for name in plan)


class SwiGLU(torch.nn.Module):  # Meta's LLaMA names: w2 (down) registered between w1 and w3
    def __init__(self):
        super().__init__()
        self.w1, self.w2, self.w3 = torch.nn.Linear(8, 32), torch.nn.Linear(32, 8), torch.nn.Linear(8, 32)


class GQA(torch.nn.Module):  # grouped-query attention: k/v narrower than q
    def __init__(self):
        super().__init__()
        self.num_heads, self.num_key_value_heads = 4, 2
        self.q_proj, self.k_proj, self.v_proj = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
        self.o_proj = torch.nn.Linear(8, 8)


class NormInside(torch.nn.Module):  # a norm over the hidden width between up and down: cannot be split
    def __init__(self):
        super().__init__()
        self.up, self.norm, self.down = torch.nn.Linear(8, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8)


def test_structure_decides_which_linear_is_the_output():
    plan, _ = automatic_plan(torch.nn.Sequential(SwiGLU()), 2)
    assert plan == {"0.w1": "colwise", "0.w3": "colwise", "0.w2": "rowwise"}
    plan, heads = automatic_plan(torch.nn.Sequential(GQA()), 2)
    assert plan["0.o_proj"] == "rowwise" and plan["0.k_proj"] == "colwise"
    assert heads == {("0", "num_heads"): 2, ("0", "num_key_value_heads"): 1}
    with pytest.raises(ConfigError) as error:  # nothing left that can be split
        automatic_plan(torch.nn.Sequential(NormInside()), 2)
    assert "found nothing to split" in _one_line(error)


class Fused(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn, self.c_proj = torch.nn.Linear(8, 24), torch.nn.Linear(8, 8)


@pytest.mark.parametrize("model, tp, expected", [
    (torch.nn.Sequential(torch.nn.MultiheadAttention(8, 2)), 2, "0 is an nn.MultiheadAttention"),
    (torch.nn.Sequential(Fused()), 2, "0.c_attn is a fused q/k/v projection"),
    (torch.nn.Sequential(GQA()), 4, "0.num_key_value_heads=2 attention heads, which tp_size=4 does not divide"),
    (torch.nn.Sequential(SwiGLU()), 3, "module '0.w1' (Linear) has 32 features to split colwise"),
])
def test_what_the_automatic_plan_refuses_names_the_module(model, tp, expected):
    with pytest.raises(ConfigError) as error:
        automatic_plan(model, tp)
    assert expected in _one_line(error)


def test_model_and_user_plans():
    model = TinyGPT()
    model._tp_plan = {"blocks.*.mlp.fc1": "colwise", "blocks.*.mlp.fc2": "rowwise"}  # transformers' attribute
    plan, heads, source = plan_for(model, 2)
    assert source == "model" and set(plan) == {"blocks.0.mlp.fc1", "blocks.1.mlp.fc1", "blocks.0.mlp.fc2",
                                               "blocks.1.mlp.fc2"} and heads == {}
    assert plan_for(model, 2, "auto")[2] == "automatic"  # "auto" ignores the model's own plan
    plan, _, source = plan_for(model, 2, {"head": "colwise_rep"})
    assert source == "user" and plan == {"head": "colwise_rep"}
    with pytest.raises(ConfigError) as error:
        resolve_plan(model, {"blocks.*.nope": "colwise"}, 2)
    assert "'blocks.*.nope' matches no module of TinyGPT" in _one_line(error)


def test_a_style_hasten_does_not_know_is_one_line():
    from hasten.distributed.tp_plan import _style

    with pytest.raises(ConfigError) as error:
        _style("diagonal", "blocks.0.mlp.fc1")
    assert "style 'diagonal' is not one hasten knows" in _one_line(error)


def test_dtensor_helpers_on_a_plain_model():
    model = TinyGPT()
    assert not model_has_dtensor(model) and get_model_tp_size(model) is None
    model.tp_size = 4  # transformers < 5 records it on the model
    assert get_model_tp_size(model) == 4


def test_tensor_parallel_on_two_processes(tmp_path):
    """TP=2 from a config file's parallelism_config block: matches one process, rank properties, data, checkpoints
    into FSDP=2, compositions on (1,2)/(2,1) meshes; then one process resumes the same checkpoint."""
    config = tmp_path / "config.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nnum_processes: 2\n"
                      "parallelism_config:\n  parallelism_config_tp_size: 2\n")
    result = launch("tp_layouts.py", tmp_path, flags=("--config_file", str(config)), timeout=400)
    assert result.stdout.count("tensor parallel checks passed") == 2, result.stdout
    one = subprocess.run([sys.executable, str(SCRIPTS / "tp_resume_one.py"), str(tmp_path)], cwd=SCRIPTS,
                         capture_output=True, text=True, timeout=180)
    assert "one process resumed the TP=2 checkpoint" in one.stdout, one.stdout + one.stderr


def test_layouts_on_four_processes(tmp_path):
    """dp_shard×tp, dp_replicate×tp and HSDP (dp_replicate×dp_shard) on 4 processes match one process; HSDP resumes
    the dp_shard×tp checkpoint and continues identically."""
    result = launch("tp_grid.py", tmp_path, num_processes=4, timeout=500)
    assert result.stdout.count("grid checks passed") == 4, result.stdout


def test_dispatch_batches_under_tensor_parallelism():
    """dispatch_batches=True on dp_shard 2 × tp 2: the ranks of one TP group keep the same slices, the two
    data-parallel groups disjoint ones covering the dataset, gather_for_metrics is exact; refused with cp."""
    result = launch("tp_dispatch.py", num_processes=4, timeout=300)
    for name in ("map-style dispatched by tp group", "an even dataset dispatched by tp group",
                 "stream dispatched by tp group", "split batches dispatched by tp group",
                 "dispatch refused under context parallelism"):
        assert f"OK {name}" in result.stdout, result.stdout


def test_the_deprecated_tp_plugin_becomes_a_parallelism_config():
    from hasten import ParallelismConfig
    from hasten.parallelism_config import TorchTensorParallelPlugin
    from hasten.plan.layout import config_for_run

    with pytest.warns(FutureWarning, match="TorchTensorParallelPlugin is deprecated"):
        config = config_for_run(None, TorchTensorParallelPlugin(tp_size=2))
    assert config.tp_size == 2 and config.tp_enabled
    with pytest.raises(ConfigError) as error:
        config_for_run(ParallelismConfig(), TorchTensorParallelPlugin(tp_size=2))
    assert "not both" in _one_line(error)


def test_maybe_context_parallel_without_cp_warns_once_and_does_nothing():
    from hasten import Accelerator

    accelerator = Accelerator(cpu=True)
    x = torch.arange(8.0)
    with pytest.warns(UserWarning, match="context parallelism is off"):
        with accelerator.maybe_context_parallel(buffers=[x], buffer_seq_dims=[0]):
            assert x.shape == (8,)
    assert x.tolist() == list(range(8))


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_context_parallel_on_two_gpus():
    """cp_size=2 on 2 GPUs: SDPA under maybe_context_parallel equals whole-sequence attention (CPU refuses it)."""
    result = launch("tp_context_parallel.py", flags=("--parallelism_config_cp_size", "2", "--multi_gpu"), timeout=300)
    assert result.stdout.count("context parallel checks passed") == 2, result.stdout


def test_fsdp1_hybrid_shard_is_refused_on_cpu():
    """FSDP1 HYBRID_SHARD silently diverges on CPU processes: refused, pointing at FSDP2 HSDP."""
    from hasten import Accelerator, FullyShardedDataParallelPlugin

    with pytest.warns(FutureWarning):  # sharding_strategy is deprecated in Accelerate too
        plugin = FullyShardedDataParallelPlugin(fsdp_version=1, sharding_strategy="HYBRID_SHARD")
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    with pytest.raises(ConfigError) as error:
        accelerator.prepare(torch.nn.Linear(4, 4))
    assert "HYBRID_SHARD (FSDP1) silently diverges on CPU" in _one_line(error)
    assert "dp_replicate_size" in str(error.value)
