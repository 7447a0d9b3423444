"""The contract every backend keeps, checked in real processes (run by tests/backends/test_contract.py).

    backend_contract.py BACKEND WORKDIR

The launch flags (set by the test's table) pick the backend; the script checks it got BACKEND, then:

1. a small training run (2 optimizer steps of 2 accumulated micro-steps, clipping, momentum, a scheduler)
   gives the weights of plain PyTorch in one process on the whole global batch;
2. `clip_grad_norm_` returns the same total norm as torch's on that whole batch;
3. `save_state` then `load_state` into fresh objects (other initial weights) continues identically;
4. `unwrap_model` returns the user's module, with its own parameter names (FSDP1: FSDP's flat parameters, as
   torch makes them), and `get_state_dict` gives the whole model, under the user's names, on the main process.

Prints `CONTRACT OK <check>` per check and process.
"""

import os
import sys

import torch

from fsdp_common import batch, fresh_accelerator, make_model
from hasten.utils import broadcast_object_list

ACCUMULATION = 2
LR, MOMENTUM, MAX_NORM, GAMMA = 0.05, 0.9, 0.5, 0.8
# fp32 everywhere: the backends only change the order of additions (all-reduce, shard-wise norms), so the
# weights agree to rounding. Measured differences are below 1e-6; 1e-5 leaves room for other reduction orders.
TOLERANCE = 1e-5


def window(step: int, rank: int, world: int) -> list:
    """The micro-batches of optimizer step `step` for this process."""
    return [batch(step * ACCUMULATION + i, rank, world) for i in range(ACCUMULATION)]


def reference(steps: int, world: int):
    """Plain PyTorch, one process, the whole global batch of each optimizer step; weights and clip norms.

    The prepared scheduler steps once per process on each optimizer step (Accelerate's rule), so this one does too."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=GAMMA)
    norms = []
    for step in range(steps):
        parts = window(step, 0, 1)
        x, y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        torch.nn.functional.mse_loss(model(x), y).backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM).item())
        optimizer.step()
        for _ in range(world):
            scheduler.step()
        optimizer.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, norms


def prepared(seed: int = 0):
    accelerator = fresh_accelerator(gradient_accumulation_steps=ACCUMULATION)
    model = make_model(seed)
    if accelerator.parallelism_config is not None and accelerator.parallelism_config.tp_enabled:
        # The model's own plan (transformers' attribute): this small net has no block the automatic plan can split.
        model._tp_plan = {"inp": "colwise_rep", "blocks.*.linear": "colwise_rep"}
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=GAMMA)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    return accelerator, model, optimizer, scheduler


def train(accelerator, model, optimizer, scheduler, steps) -> list:
    """The loop of an Accelerate script; returns the total norm `clip_grad_norm_` reported at each sync step."""
    norms = []
    for step in steps:
        for x, y in window(step, *data_share(accelerator)):
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    norms.append(float(accelerator.clip_grad_norm_(model.parameters(), MAX_NORM)))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
    return norms


def data_share(accelerator) -> tuple:
    """(rank, world) of this process's data: processes of one tensor-parallel group read the same batch."""
    from hasten.data.ranks import data_ranks, splits_data_ranks

    mesh = accelerator.torch_device_mesh
    if splits_data_ranks(mesh):
        size, index = data_ranks(mesh)
        return index, size
    return accelerator.process_index, accelerator.num_processes


def full_params(accelerator, model) -> dict:
    """The whole model on every process (get_state_dict gives it on the main process)."""
    state = accelerator.get_state_dict(model)
    return broadcast_object_list([state if accelerator.is_main_process else None])[0]


def assert_close(got: dict, expected: dict, what: str, tolerance: float = TOLERANCE) -> None:
    assert set(got) == set(expected), f"{what}: names differ: {sorted(got)} vs {sorted(expected)}"
    for name in expected:
        diff = (got[name].float() - expected[name].float()).abs().max().item()
        assert diff <= tolerance, f"{what}: {name} differs by {diff:.3g} (tolerance {tolerance})"


def main(expected_backend: str, workdir: str) -> None:
    accelerator, model, optimizer, scheduler = prepared()
    backend = accelerator._backend.name
    assert backend == expected_backend, f"the launch flags picked the {backend} backend, not {expected_backend}"
    rank = accelerator.process_index
    world = data_share(accelerator)[1]  # the scheduler steps once per different batch

    # 1-2. Training and clipping match plain PyTorch on the whole batch.
    norms = train(accelerator, model, optimizer, scheduler, range(2))
    expected, expected_norms = reference(2, world)
    assert_close(full_params(accelerator, model), expected, "weights after 2 steps")
    print("CONTRACT OK training", flush=True)
    assert len(norms) == len(expected_norms) == 2, norms
    for got, want in zip(norms, expected_norms):
        assert abs(got - want) <= TOLERANCE * max(1.0, want), f"clip_grad_norm_ returned {got}, torch {want}"
    print("CONTRACT OK clip_grad_norm_", flush=True)

    # 3. Save, go on; load into fresh objects with other weights, go on the same way: identical.
    folder = os.path.join(workdir, f"contract_{backend}")
    accelerator.save_state(folder)
    train(accelerator, model, optimizer, scheduler, range(2, 4))
    continued = full_params(accelerator, model)
    lr = scheduler.get_last_lr()

    accelerator, model, optimizer, scheduler = prepared(seed=1)
    accelerator.load_state(folder)
    assert accelerator.step == 2 * ACCUMULATION, f"step counter {accelerator.step} after load_state"
    train(accelerator, model, optimizer, scheduler, range(2, 4))
    assert_close(full_params(accelerator, model), continued, "weights after resuming", tolerance=0.0)
    assert scheduler.get_last_lr() == lr, (scheduler.get_last_lr(), lr)
    expected, _ = reference(4, world)
    assert_close(continued, expected, "weights after 4 steps")
    print("CONTRACT OK save_state load_state", flush=True)

    # 4. The user's module comes back, under its own names; the whole state dict on the main process.
    plain = make_model()
    unwrapped = accelerator.unwrap_model(model)
    assert isinstance(unwrapped, type(plain)), f"unwrap_model gave a {type(unwrapped).__name__}"
    if getattr(accelerator._backend, "version", None) == 1:
        # FSDP1 (torch's wrapper API, as in Accelerate) keeps the parameters inside its inner wrappers, so the
        # unwrapped module's own names are FSDP's: flat parameters, or with use_orig_params (on under
        # `hasten launch --use_fsdp`, as under Accelerate's launcher) the originals under `_fsdp_wrapped_module`;
        # the user's names come from get_state_dict.
        marker = "_fsdp_wrapped_module" if accelerator.state.fsdp_plugin.use_orig_params else "_flat_param"
        assert any(marker in n for n, _ in unwrapped.named_parameters()), list(unwrapped.named_parameters())
    else:
        assert [n for n, _ in unwrapped.named_parameters()] == [n for n, _ in plain.named_parameters()]
    state = accelerator.get_state_dict(model)
    if rank == 0:
        assert list(state) == list(plain.state_dict()), f"get_state_dict names {list(state)}"
        assert_close(state, continued, "get_state_dict", tolerance=0.0)
    print("CONTRACT OK unwrap_model get_state_dict", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
