"""Single-process behaviour of the Accelerator facade (in this pytest process)."""

import math

import pytest
import torch

from hasten import Accelerator, DistributedType, GradientAccumulationPlugin
from hasten.config.handlers import AutocastKwargs, GradScalerKwargs, TorchDynamoPlugin
from hasten.core.errors import ConfigError
from hasten.training.memory import find_executable_batch_size, release_memory, should_reduce_batch_size


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def test_single_process_identity():
    acc = Accelerator()
    assert acc.distributed_type == DistributedType.NO
    assert (acc.num_processes, acc.process_index, acc.is_main_process, acc.use_distributed) == (1, 0, True, False)
    assert acc.device == torch.device("cpu")
    assert acc.mixed_precision == "no" and acc.sync_gradients and acc.gradient_accumulation_steps == 1
    assert acc.step == 0 and not acc.optimizer_step_was_skipped


def test_prepare_returns_objects_in_order_and_passes_unknown_through():
    acc = Accelerator()
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    marker = object()
    # scheduler first: it is still bound to its optimizer's wrapper
    s, m, thing, o = acc.prepare(sched, model, marker, opt)
    assert thing is marker
    assert isinstance(m, torch.nn.Module) and o.optimizer is opt and s.scheduler is sched
    assert s.optimizers == [o]
    assert acc.prepare(model) is m  # already prepared: returned as is
    single = acc.prepare(tiny_model())
    assert isinstance(single, torch.nn.Module)  # one object comes back bare


def test_prepare_rejects_bad_objects():
    acc = Accelerator()
    with pytest.raises(TypeError, match="class Linear, not an instance"):
        acc.prepare(torch.nn.Linear)
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ConfigError, match="device_placement has 1 entries"):
        acc.prepare(model, opt, device_placement=[True])


def test_scheduler_of_an_unprepared_optimizer_binds_to_all_or_is_refused_under_strict(monkeypatch):
    monkeypatch.delenv("HASTEN_STRICT", raising=False)
    acc = Accelerator()
    model = tiny_model()
    prepared = acc.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    stray = torch.optim.SGD(tiny_model(1).parameters(), lr=0.1)
    # As in Accelerate: silently bound to every prepared optimizer, including ones prepared later.
    sched = acc.prepare(torch.optim.lr_scheduler.StepLR(stray, 1))
    later = acc.prepare_optimizer(torch.optim.SGD(tiny_model(2).parameters(), lr=0.1))
    assert sched.optimizers == [prepared, later]
    monkeypatch.setenv("HASTEN_STRICT", "1")
    with pytest.raises(ConfigError, match="optimizer was not prepared: pass the optimizer to prepare"):
        acc.prepare(torch.optim.lr_scheduler.StepLR(stray, 1))


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"mixed_precision": "fp32"}, ConfigError, "Unknown mixed precision 'fp32'"),
        ({"mixed_precision": "fp8", "cpu": True}, ConfigError, "fp8 training needs a CUDA GPU with compute capability >= 8.9"),
        ({"gradient_accumulation_steps": 0}, ConfigError, "positive integer"),
        ({"gradient_accumulation_steps": 2, "gradient_accumulation_plugin": GradientAccumulationPlugin(num_steps=2)},
         ConfigError, "not both"),
        ({"kwargs_handlers": [GradientAccumulationPlugin()]}, ConfigError, "not a kwargs handler"),
        ({"kwargs_handlers": [AutocastKwargs(), AutocastKwargs()]}, ConfigError, "only one AutocastKwargs"),
        ({"kwargs_handlers": ["bf16"]}, ConfigError, "KwargsHandler objects"),
        ({"dynamo_backend": "inductor", "dynamo_plugin": TorchDynamoPlugin()}, ConfigError, "not both"),
        ({"dynamo_backend": "turbo"}, ConfigError, "Unknown dynamo backend"),
        ({"deepspeed_plugin": object()}, ConfigError, "DeepSpeedPlugin"),
        ({"megatron_lm_plugin": object()}, TypeError, "megatron_lm_plugin must be a MegatronLMPlugin"),
    ],
)
def test_bad_constructor_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        Accelerator(**kwargs)


def test_env_mixed_precision_and_accumulation_steps(monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    monkeypatch.setenv("HASTEN_MIXED_PRECISION", "bf16")  # hasten's own variable wins
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4")
    acc = Accelerator(gradient_accumulation_steps=2)
    assert acc.mixed_precision == "bf16"
    assert acc.gradient_accumulation_steps == 4  # as in Accelerate, the launcher's value wins


def test_bad_env_mixed_precision_names_the_variable(monkeypatch):
    monkeypatch.setenv("HASTEN_MIXED_PRECISION", "half")
    with pytest.raises(ConfigError, match="HASTEN_MIXED_PRECISION"):
        Accelerator()


def test_second_accelerator_shares_state_and_refuses_changes():
    first = Accelerator(mixed_precision="bf16")
    second = Accelerator()
    assert second.state.mixed_precision == "bf16" and second.device == first.device
    with pytest.raises(ValueError, match="already been initialized"):
        Accelerator(mixed_precision="no")


def test_split_batches_argument_warns_and_is_ignored():
    with pytest.warns(FutureWarning, match="dataloader_config"):
        acc = Accelerator(split_batches=True)
    assert acc.split_batches is False


def test_accumulation_matches_large_batch():
    torch.manual_seed(0)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    reference = tiny_model()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    torch.nn.functional.mse_loss(reference(x), y).backward()
    ref_opt.step()

    acc = Accelerator(gradient_accumulation_steps=4)
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    syncs = []
    for xb, yb in zip(x.chunk(4), y.chunk(4)):
        with acc.accumulate(model):
            acc.backward(torch.nn.functional.mse_loss(model(xb), yb))
            syncs.append((acc.step, acc.sync_gradients))
            opt.step()
            opt.zero_grad()
    assert syncs == [(1, False), (2, False), (3, False), (4, True)]
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_scheduler_steps_only_with_the_optimizer():
    acc = Accelerator(gradient_accumulation_steps=3)
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5**step)
    model, opt, sched = acc.prepare(model, opt, sched)
    lrs = []
    for _ in range(6):
        with acc.accumulate(model):
            acc.backward(model(torch.randn(2, 4)).sum())
            opt.step()
            sched.step()
            opt.zero_grad()
        lrs.append(sched.get_last_lr()[0])
    assert lrs == [1.0, 1.0, 0.5, 0.5, 0.5, 0.25]


def test_bf16_autocast_computes_in_bf16_and_returns_fp32():
    acc = Accelerator(mixed_precision="bf16")
    model = acc.prepare(tiny_model())
    out = model(torch.randn(3, 4))
    assert out.dtype == torch.float32
    with acc.autocast():
        inner = torch.nn.functional.linear(torch.randn(2, 4), torch.randn(3, 4))
    assert inner.dtype == torch.bfloat16
    with acc.autocast(AutocastKwargs(enabled=False)):
        assert torch.nn.functional.linear(torch.randn(2, 4), torch.randn(3, 4)).dtype == torch.float32
    plain = acc.unwrap_model(model, keep_fp32_wrapper=False)
    with torch.no_grad():
        assert plain(torch.randn(3, 4)).dtype == torch.float32  # the original forward, no autocast
    assert "forward" not in plain.__dict__


def test_fp16_overflow_skips_the_step_and_lowers_the_scale():
    acc = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)])
    assert acc.scaler is not None and acc.native_amp
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    model, opt, sched = acc.prepare(model, opt, sched)
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(torch.randn(2, 4)).sum() * float("inf")
    acc.backward(loss)
    opt.step()
    sched.step()
    assert acc.optimizer_step_was_skipped
    assert acc.scaler.get_scale() == 512.0
    assert sched.get_last_lr()[0] == 0.1  # no scheduler step after a skipped optimizer step
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    opt.zero_grad()
    acc.backward(model(torch.randn(2, 4)).float().pow(2).mean())
    opt.step()
    sched.step()
    assert not acc.optimizer_step_was_skipped and sched.get_last_lr()[0] == 0.05
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_clip_grad_norm_unscales_first():
    acc = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=256.0)])
    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    x = torch.randn(4, 4)
    acc.backward(model(x).float().sum())
    norm = acc.clip_grad_norm_(model.parameters(), max_norm=1e9)
    reference = tiny_model()
    reference(x).sum().backward()
    expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), 1e9)
    torch.testing.assert_close(norm, expected, rtol=1e-2, atol=1e-3)


def test_unwrap_model_and_compile():
    acc = Accelerator(dynamo_backend="eager")
    model = tiny_model()
    prepared = acc.prepare(model)
    assert hasattr(prepared, "_orig_mod")  # compiled
    assert acc.unwrap_model(prepared, keep_torch_compile=False) is model
    x = torch.randn(2, 4)
    torch.testing.assert_close(prepared(x), model(x))


def test_set_and_check_trigger():
    acc = Accelerator()
    assert acc.check_trigger() is False
    acc.set_trigger()
    assert acc.check_trigger() is True
    assert acc.check_trigger() is False


def test_decorators_run_everywhere_in_one_process():
    acc = Accelerator()
    assert acc.on_main_process(lambda: 1)() == 1
    assert acc.on_process(lambda: 2, process_index=0)() == 2
    assert acc.on_last_process(lambda: 3)() == 3


def test_find_executable_batch_size_shrinks_and_remembers():
    tried = []

    @find_executable_batch_size(starting_batch_size=128)
    def train(batch_size):
        tried.append(batch_size)
        if batch_size > 50:
            raise RuntimeError("CUDA out of memory.")
        return batch_size

    assert train() == 46
    assert tried == [128, 115, 103, 92, 82, 73, 65, 58, 52, 46]
    assert train() == 46 and tried[-1] == 46
    assert should_reduce_batch_size(RuntimeError("DefaultCPUAllocator: can't allocate memory"))
    assert not should_reduce_batch_size(ValueError("out of memory."))
    with pytest.raises(TypeError, match="first argument"):
        train(3)


def test_release_memory_and_free_memory():
    acc = Accelerator()
    model = acc.prepare(tiny_model())
    a, b = release_memory(model, 1)
    assert a is None and b is None
    acc.step = 5
    acc.free_memory()
    assert acc._models == [] and acc.step == 0


def test_register_for_checkpointing_validates():
    acc = Accelerator()
    with pytest.raises(ConfigError, match="object"):
        acc.register_for_checkpointing(object())
    with pytest.raises(ValueError) as refused:  # Accelerate's words, each offender by its argument position
        acc.register_for_checkpointing(torch.nn.Linear(1, 1), torch.zeros(1), object())
    message = str(refused.value)
    assert message.startswith("All `objects` must include a `state_dict` and `load_state_dict` function")
    assert "Item at index 1, `Tensor`" in message and "Item at index 2, `object`" in message
    assert "Item at index 0" not in message
    acc.register_for_checkpointing(torch.nn.Linear(1, 1))
    assert len(acc._custom_objects) == 1


def test_fp16_loss_scaling_keeps_small_gradients():
    # A gradient that underflows in fp16 (1e-8) survives thanks to the scaler.
    acc = Accelerator(mixed_precision="fp16")
    model = acc.prepare(torch.nn.Linear(1, 1, bias=False))
    acc.backward(model(torch.ones(1, 1)).float().sum() * 1e-8)
    grad = model.weight.grad.item() / acc.scaler.get_scale()
    assert math.isclose(grad, 1e-8, rel_tol=1e-2)


def test_should_save_model_follows_is_local_main_process(monkeypatch):
    """Accelerate: the local main process without a ParallelismConfig (hasten returned True everywhere)."""
    accelerator = Accelerator()
    assert accelerator.parallelism_config is None and accelerator.should_save_model is True
    monkeypatch.setattr(type(accelerator.state), "is_local_main_process", property(lambda self: False))
    assert accelerator.should_save_model is False


def test_lomo_optimizer_is_detected_and_its_fused_backward_runs():
    """`has_lomo_optimizer` follows the prepared optimizers; backward(loss, learning_rate=) calls fused_backward."""
    import types

    calls = []
    module = types.ModuleType("lomo_optim")

    class Lomo(torch.optim.SGD):
        def fused_backward(self, loss, lr):
            calls.append(lr)
            loss.backward()

    Lomo.__module__ = "lomo_optim"
    accelerator = Accelerator()
    model = torch.nn.Linear(2, 1)
    plain = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    assert accelerator.has_lomo_optimizer is False and plain is not None
    model, optimizer = accelerator.prepare(model, Lomo(model.parameters(), lr=0.1))
    assert accelerator.has_lomo_optimizer is True and module is not None
    accelerator.backward(model(torch.ones(1, 2)).sum(), learning_rate=0.5)
    assert calls == [0.5] and model.weight.grad is not None


# What only a layout knows (issue 39): the facade hands every such decision to the backend, built from the plan.
_LAYOUT_ATTRIBUTES = {"native_sp_enabled", "sp_size", "sp_backend", "megatron_lm_plugin", "ulysses_mpu",
                      "accelerate_fsdp2_step"}
_LAYOUT_MODULES = {"megatron", "sequence_parallel", "sequence_shard"}
_LAYOUT_TYPES = {"FSDP", "DEEPSPEED", "MEGATRON_LM", "XLA"}


def test_the_facade_has_no_layout_branch():
    """accelerator.py never asks which layout or backend it runs: no sequence-parallel, Megatron-LM, Ulysses or FSDP2
    test, no distributed type of a backend, no probing of the backend by getattr/hasattr/isinstance/name."""
    import ast
    import pathlib

    import hasten.accelerator

    tree = ast.parse(pathlib.Path(hasten.accelerator.__file__).read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in _LAYOUT_ATTRIBUTES:
            found.append(f"line {node.lineno}: .{node.attr}")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "DistributedType" \
                and node.attr in _LAYOUT_TYPES:
            found.append(f"line {node.lineno}: DistributedType.{node.attr}")
        if isinstance(node, ast.ImportFrom):
            names = {(node.module or "").rsplit(".", 1)[-1]} | {alias.name for alias in node.names}
            found += [f"line {node.lineno}: imports {name}" for name in sorted(names & _LAYOUT_MODULES)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "hasattr", "isinstance") and node.args \
                and "_backend" in ast.unparse(node.args[0]):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Compare) and "_backend.name" in ast.unparse(node):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    assert found == [], found
