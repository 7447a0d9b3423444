"""Megatron-LM settings served by hasten's own TP/PP/FSDP, in 4 real processes. Launched with a config file whose
megatron_lm_config block asks for tp_degree 2, pp_degree 2, 2 micro-batches, recompute_activations and
gradient_clipping 0.5. Usage: megatron_layouts.py <layout>...
layouts: file (the plugin from the launcher's MEGATRON_LM_* variables: TP x PP), code (MegatronLMPlugin in code:
tp_degree 2 with use_distributed_optimizer over 2 data-parallel ranks), refused (Megatron-only objects)."""

import sys

import torch
import torch.distributed as dist

from pp_common import fresh_accelerator, loss_of, make_model, max_diff, sgd, tokens
from hasten.core.errors import MegatronLMOnlyError
from hasten.utils import MegatronLMPlugin
from hasten.utils.megatron_lm import GPTTrainStep, MegatronEngine, avg_losses_across_data_parallel_group

TOL = 1e-5
CLIP = 0.5


def reference(steps):
    """One process, the same global batches, the global gradient norm clipped to CLIP before each step."""
    model = make_model()
    opt = sgd(model.parameters())
    losses, clipped = [], 0
    for step in steps:
        loss = loss_of(model, tokens(step))
        loss.backward()
        clipped += float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)) > CLIP
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert clipped, "the reference's gradient norm never exceeded the clip: the test would not see clipping"
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


want, want_losses = reference(range(5))


def train(acc, pipelined):
    model = make_model(seed=1)
    model.load_state_dict(make_model().state_dict())
    opt = sgd(model.parameters())
    model, opt = acc.prepare(model, opt)
    layout = acc.parallelism_config
    data_size = layout.data_parallel_size
    dp_rank = acc.data_parallel_shard_rank if layout.dp_shard_enabled else 0
    losses = []
    for step in range(5):
        local = tokens(step).chunk(data_size)[dp_rank]
        if pipelined:
            loss = model(local[:, :-1], labels=local[:, 1:])
        else:
            loss = loss_of(model, local)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(avg_losses_across_data_parallel_group([loss])[0].item())
    for got, expected in zip(losses, want_losses):
        assert abs(got - expected) < TOL, (losses, want_losses)
    full = acc.get_state_dict(model)
    if acc.is_main_process:
        diff = max_diff(full, want)
        assert diff < TOL, diff
    return model


def run(name):
    if name == "file":
        acc = fresh_accelerator()
        plugin = acc.state.megatron_lm_plugin
        assert (plugin.tp_degree, plugin.pp_degree, plugin.num_micro_batches) == (2, 2, 2), plugin
        assert plugin.recompute_activations and plugin.gradient_clipping == CLIP, plugin
        layout = acc.parallelism_config
        assert (layout.tp_size, layout.pp_size, layout.pp_handler.microbatches) == (2, 2, 2), layout
        assert acc.state.fsdp_plugin.activation_checkpointing
        model = train(acc, pipelined=True)
        assert model.num_microbatches == 2
        acc.print("megatron file: tp_degree 2 x pp_degree 2 (2 micro-batches, recompute, clip 0.5) equals one process")
    elif name == "code":
        plugin = MegatronLMPlugin(tp_degree=2, pp_degree=1, num_micro_batches=1, recompute_activations=False,
                                  use_distributed_optimizer=True)
        acc = fresh_accelerator(megatron_lm_plugin=plugin)
        layout = acc.parallelism_config
        assert (layout.tp_size, layout.dp_shard_size, layout.pp_size) == (2, 2, 1), layout
        train(acc, pipelined=False)
        acc.print("megatron code: tp_degree 2 x distributed optimizer over 2 ranks equals one process")
    elif name == "refused":
        acc = fresh_accelerator()
        for make in (lambda: GPTTrainStep(acc, None), lambda: MegatronEngine(acc, None, None, None)):
            try:
                make()
            except MegatronLMOnlyError as error:
                assert "\n" not in str(error) and "fix:" in str(error), error
            else:
                raise AssertionError("a Megatron-only object was built")
        acc.print("megatron refused: GPTTrainStep and MegatronEngine refuse in one line")
    dist.barrier()


for layout in sys.argv[1:]:
    run(layout)
