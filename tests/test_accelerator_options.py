"""Accelerator options shown by their effect in one process: each test changes one option and checks the object or
value it reaches (the acceptance matrix, tests/test_acceptance_matrix.py, maps the entries here)."""

import json

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from hasten import Accelerator
from hasten.config.handlers import (
    AutocastKwargs,
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    ProjectConfiguration,
    TorchDynamoPlugin,
)
from hasten.data_loader import prepare_data_loader


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 1)


def loader(n=8, batch_size=2, **kwargs):
    return DataLoader(TensorDataset(torch.arange(n * 4, dtype=torch.float32).view(n, 4)), batch_size=batch_size,
                      **kwargs)


# -- schedulers and accumulation --------------------------------------------------------------------------------
@pytest.mark.parametrize("step_with_optimizer", [True, False])
def test_step_scheduler_with_optimizer_decides_whether_micro_steps_step_the_scheduler(step_with_optimizer):
    """Accelerator(step_scheduler_with_optimizer=False): every scheduler.step() call steps it; True (the default):
    only the call after a real optimizer step does (one in two with two accumulation steps)."""
    acc = Accelerator(gradient_accumulation_steps=2, step_scheduler_with_optimizer=step_with_optimizer)
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    model, optimizer, scheduler = acc.prepare(model, optimizer, scheduler)
    for _ in range(4):
        with acc.accumulate(model):
            acc.backward(model(torch.ones(2, 4)).sum())
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    assert scheduler.scheduler.last_epoch == (2 if step_with_optimizer else 4)


@pytest.mark.parametrize("adjust", [True, False])
def test_gradient_accumulation_plugin_adjust_scheduler_counts_micro_steps(adjust):
    """GradientAccumulationPlugin(adjust_scheduler=True) advances the scheduler's step counter on the micro-steps
    that do not step it; False leaves the counter at the real steps. The learning rate follows real steps only."""
    plugin = GradientAccumulationPlugin(num_steps=2, adjust_scheduler=adjust)
    acc = Accelerator(gradient_accumulation_plugin=plugin)
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    model, optimizer, scheduler = acc.prepare(model, optimizer, scheduler)
    for _ in range(4):
        with acc.accumulate(model):
            acc.backward(model(torch.ones(2, 4)).sum())
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    assert scheduler.scheduler.last_epoch == 2
    # 1 at construction, +2 real steps, +2 micro-steps only when adjusting
    assert scheduler.scheduler._step_count == (5 if adjust else 3)


@pytest.mark.parametrize("sync_with_dataloader", [True, False])
def test_gradient_accumulation_plugin_sync_with_dataloader_syncs_on_the_last_batch(sync_with_dataloader):
    """Three accumulation steps over a loader of four batches: the last batch synchronises (and the optimizer
    steps) with sync_with_dataloader=True; with False only every third micro-step does."""
    plugin = GradientAccumulationPlugin(num_steps=3, sync_with_dataloader=sync_with_dataloader)
    acc = Accelerator(gradient_accumulation_plugin=plugin)
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, data = acc.prepare(model, optimizer, loader(8, 2))
    synced = []
    for (batch,) in data:
        with acc.accumulate(model):
            acc.backward(model(batch).sum())
            synced.append(acc.sync_gradients)
            optimizer.step()
            optimizer.zero_grad()
    assert synced == [False, False, True, sync_with_dataloader]


# -- precision --------------------------------------------------------------------------------------------------
def test_grad_scaler_kwargs_reach_the_fp16_scaler():
    """GradScalerKwargs(init_scale, growth_factor, backoff_factor, growth_interval) are the scaler's numbers: an
    overflow multiplies the scale by backoff_factor, a clean step (growth_interval=1) by growth_factor;
    enabled=False gives a scaler that never scales."""
    handler = GradScalerKwargs(init_scale=64.0, growth_factor=3.0, backoff_factor=0.25, growth_interval=1)
    acc = Accelerator(mixed_precision="fp16", kwargs_handlers=[handler])
    scaler = acc.scaler
    assert scaler.is_enabled() and scaler.get_scale() == 64.0
    assert (scaler.get_growth_factor(), scaler.get_backoff_factor(), scaler.get_growth_interval()) == (3.0, 0.25, 1)
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = acc.prepare(model, optimizer)
    acc.backward(model(torch.full((2, 4), float("inf"))).sum())  # overflow: skipped, scale backs off
    optimizer.step()
    optimizer.zero_grad()
    assert acc.optimizer_step_was_skipped and scaler.get_scale() == 16.0
    acc.backward(model(torch.ones(2, 4)).sum())  # clean: scale grows after one step
    optimizer.step()
    assert not acc.optimizer_step_was_skipped and scaler.get_scale() == 48.0

    from hasten.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    off = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(enabled=False)])
    assert off.scaler is not None and not off.scaler.is_enabled()
    assert off.scaler.scale(torch.tensor(2.0)).item() == 2.0


@pytest.mark.parametrize("cache_enabled", [True, False])
def test_autocast_kwargs_cache_enabled_reaches_torch_autocast(cache_enabled):
    """AutocastKwargs(cache_enabled=...) is the autocast weight-cast cache of the prepared model's forward and of
    accelerator.autocast()."""
    acc = Accelerator(mixed_precision="bf16", kwargs_handlers=[AutocastKwargs(cache_enabled=cache_enabled)])
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append((torch.is_autocast_enabled("cpu"), torch.is_autocast_cache_enabled()))
            return x

    model = acc.prepare(Probe())
    model(torch.ones(1))
    with acc.autocast():
        seen.append((torch.is_autocast_enabled("cpu"), torch.is_autocast_cache_enabled()))
    assert seen == [(True, cache_enabled), (True, cache_enabled)]


# -- compilation ------------------------------------------------------------------------------------------------
def test_torch_dynamo_plugin_fields_reach_torch_compile(monkeypatch):
    """TorchDynamoPlugin(backend, mode, fullgraph, dynamic, options, disable) are torch.compile's arguments when
    Accelerator.prepare compiles the model."""
    import hasten.training.compilation as compilation

    calls = []

    def fake_compile(model, **kwargs):
        calls.append(kwargs)
        return model

    monkeypatch.setattr(compilation.torch, "compile", fake_compile)
    plugin = TorchDynamoPlugin(backend="inductor", mode="reduce-overhead", fullgraph=True, dynamic=False,
                               options={"trace.enabled": False}, disable=True)
    acc = Accelerator(dynamo_plugin=plugin)
    acc.prepare(tiny_model())
    assert calls == [{"backend": "inductor", "mode": "reduce-overhead", "fullgraph": True, "dynamic": False,
                      "options": {"trace.enabled": False}, "disable": True}], calls
    from hasten.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    Accelerator(dynamo_backend="eager").prepare(tiny_model())  # the older spelling: the backend alone
    assert calls[-1]["backend"] == "eager", calls


# -- data loaders -----------------------------------------------------------------------------------------------
def test_rng_types_decide_which_generators_each_pass_synchronises(monkeypatch):
    """Accelerator(rng_types=[...]) is the list the prepared loader synchronises from process 0 at the start of
    each pass; the default synchronises the sampler's generator only; [] synchronises nothing. (One process:
    the sampler has a generator only when the script gives one; without, "generator" is dropped, as in
    Accelerate.)"""
    import hasten.data.shard as shard

    calls = []
    monkeypatch.setattr(shard, "synchronize_rng_states", lambda types, generator=None: calls.append(list(types)))
    for rng_types, expected in ((None, [["generator"]]), (["torch", "generator"], [["torch", "generator"]]), ([], [])):
        from hasten.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        calls.clear()
        acc = Accelerator(rng_types=rng_types)
        data = acc.prepare(loader(4, 2, shuffle=True, generator=torch.Generator().manual_seed(0)))
        list(data)
        assert calls == expected, (rng_types, calls)
    calls.clear()
    AcceleratorState._reset_state(reset_partial_state=True)
    list(Accelerator(rng_types=["torch", "generator"]).prepare(loader(4, 2, shuffle=True)))
    assert calls == [["torch"]], calls


def test_split_batches_argument_is_ignored_with_accelerates_warning():
    with pytest.warns(FutureWarning, match=r"Accelerator\(split_batches=\.\.\.\) is ignored \(as in Accelerate\)"):
        accelerator = Accelerator(split_batches=True)
    assert accelerator.split_batches is False  # DataLoaderConfiguration(split_batches=...) is the switch


def test_dataloader_configuration_fields_reach_the_prepared_loader():
    """DataLoaderConfiguration(dispatch_batches=True) gives a loader that dispatches from process 0;
    non_blocking=True moves batches with non_blocking copies; data_seed (with use_seedable_sampler) is the seed of
    the shuffle: the same seed gives the same order, another seed another (even_batches needs two processes:
    tests/backends/test_ddp.py::test_prepared_loaders_split_flush_and_metrics)."""
    from hasten.data_loader import DataLoaderDispatcher, DataLoaderShard
    from hasten.state import AcceleratorState, GradientState

    def fresh(**config):
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        return Accelerator(dataloader_config=DataLoaderConfiguration(**config))

    assert isinstance(fresh(dispatch_batches=True).prepare(loader()), DataLoaderDispatcher)
    assert isinstance(fresh(dispatch_batches=False).prepare(loader()), DataLoaderShard)

    # On a CPU run batches stay where they are; the flag is what the loader hands its moves (shown on a device
    # move in test_prepare_data_loader_dataloader_non_blocking_and_slice_fn_for_dispatch).
    for non_blocking in (True, False):
        assert fresh(non_blocking=non_blocking).prepare(loader())._non_blocking is non_blocking

    def order(seed, global_seed=0):
        torch.manual_seed(global_seed)  # use_seedable_sampler: the order owes nothing to torch's global generator
        data = fresh(use_seedable_sampler=True, data_seed=seed).prepare(loader(16, 4, shuffle=True))
        return torch.cat([b for (b,) in data])[:, 0].tolist()

    assert order(7) == order(7, global_seed=1) and order(7) != order(8)



def test_prepare_data_loader_dataloader_non_blocking_and_slice_fn_for_dispatch(monkeypatch):
    """prepare_data_loader(dataloader=...) wraps that loader (same samples, same batch size); non_blocking=True is
    passed to every batch move; slice_fn_for_dispatch cuts each dispatched batch (here: keeps it whole, doubled)."""
    import hasten.data.shard as shard

    source = loader(6, 3)
    wrapped = prepare_data_loader(dataloader=source, put_on_device=True, device=torch.device("cpu"))
    assert [b.tolist() for (b,) in wrapped] == [b.tolist() for (b,) in source]

    moves = []
    real = shard.send_to_device
    monkeypatch.setattr(shard, "send_to_device",
                        lambda batch, device, non_blocking=False, **kw: moves.append(non_blocking) or real(
                            batch, device, non_blocking=non_blocking, **kw))
    for non_blocking in (True, False):  # "meta": a device move without a GPU
        moved = [b for (b,) in prepare_data_loader(source, put_on_device=True, device=torch.device("meta"),
                                                   non_blocking=non_blocking)]
        assert [b.device.type for b in moved] == ["meta", "meta"]
    assert moves == [True, True, False, False]

    cuts = []

    def slice_fn(batch, index, process_index, num_processes):
        cuts.append((index, process_index, num_processes))
        return [tensor * 2 for tensor in batch]

    dispatched = prepare_data_loader(source, put_on_device=True, device=torch.device("cpu"), dispatch_batches=True,
                                     slice_fn_for_dispatch=slice_fn)
    batches = [b for (b,) in dispatched]
    assert [b.tolist() for b in batches] == [(b * 2).tolist() for (b,) in source]
    assert cuts == [(slice(0, 3), 0, 1), (slice(0, 3), 0, 1)]


# -- saving and logging -----------------------------------------------------------------------------------------
def test_save_model_writes_into_save_directory(tmp_path):
    """Accelerator.save_model(model, save_directory=...) writes the weights there, and they load back."""
    from safetensors.torch import load_file

    acc = Accelerator()
    model = acc.prepare(tiny_model(3))
    target = tmp_path / "exported"
    acc.save_model(model, save_directory=str(target))
    assert sorted(p.name for p in target.iterdir()) == ["model.safetensors"]
    loaded = load_file(str(target / "model.safetensors"))
    assert all(torch.equal(loaded[k], v) for k, v in model.state_dict().items())


def test_project_configuration_logging_dir_is_where_trackers_write(tmp_path):
    """ProjectConfiguration(logging_dir=...) is where a tracker that needs a directory writes, not project_dir."""
    project, logs = tmp_path / "project", tmp_path / "logs"
    acc = Accelerator(log_with="jsonl", project_config=ProjectConfiguration(project_dir=str(project),
                                                                            logging_dir=str(logs)))
    assert acc.logging_dir == str(logs)
    acc.init_trackers("run", config={"lr": 0.1})
    acc.log({"loss": 1.5}, step=1)
    acc.end_training()
    lines = (logs / "run" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["values"] == {"loss": 1.5}
    assert json.loads((logs / "run" / "config.json").read_text()) == {"lr": 0.1}  # init_trackers(config=...)
    assert not project.exists() or not any(project.rglob("metrics.jsonl"))


@pytest.mark.parametrize("save_on_each_node", [True, False])
def test_project_configuration_save_on_each_node_decides_which_ranks_write(tmp_path, save_on_each_node):
    """ProjectConfiguration(save_on_each_node=True): the local main process of every machine writes; False: only
    the global main process. Shown as rank 1 of a second machine (its local main process)."""
    acc = Accelerator(project_config=ProjectConfiguration(project_dir=str(tmp_path),
                                                          save_on_each_node=save_on_each_node))
    from hasten.state import PartialState

    for state in (acc.state, PartialState()):
        state.process_index, state.local_process_index = 1, 0  # a second machine's first process
    assert not acc.is_main_process and acc.is_local_main_process
    acc.save({"x": torch.ones(2)}, str(tmp_path / "obj.pt"))
    assert (tmp_path / "obj.pt").exists() == save_on_each_node


def test_torch_tp_plugin_becomes_the_tensor_parallel_layout():
    """Accelerator(torch_tp_plugin=TorchTensorParallelPlugin(tp_size=n)) (deprecated, as in Accelerate) is
    ParallelismConfig(tp_size=n); given with a parallelism_config, or as another type, it is refused in one line."""
    from hasten.core.errors import ConfigError
    from hasten.parallelism_config import ParallelismConfig, TorchTensorParallelPlugin
    from hasten.state import AcceleratorState, GradientState

    with pytest.warns(FutureWarning, match="TorchTensorParallelPlugin is deprecated"):
        acc = Accelerator(torch_tp_plugin=TorchTensorParallelPlugin(tp_size=1))
    assert acc.parallelism_config is not None and acc.parallelism_config.tp_size == 1
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    with pytest.raises(ConfigError, match="either torch_tp_plugin or parallelism_config"):
        Accelerator(torch_tp_plugin=TorchTensorParallelPlugin(tp_size=1), parallelism_config=ParallelismConfig())
    with pytest.raises(TypeError, match="torch_tp_plugin must be a TorchTensorParallelPlugin"):
        Accelerator(torch_tp_plugin={"tp_size": 2})


def test_init_process_group_kwargs_timeout_equal_to_the_default_is_honoured(monkeypatch):
    """InitProcessGroupKwargs(timeout=600 s): to_kwargs() leaves 600 s out (it equals the dataclass default, as in
    Accelerate), yet the run's collective timeout is the 600 s asked for, not hasten's 1800 s gloo default."""
    from datetime import timedelta

    monkeypatch.delenv("HASTEN_COLLECTIVE_TIMEOUT", raising=False)
    handler = InitProcessGroupKwargs(timeout=timedelta(seconds=600))
    assert handler.to_kwargs() == {}
    acc = Accelerator(cpu=True, kwargs_handlers=[handler])
    assert acc.state.collective_timeout == timedelta(seconds=600)
