"""DeepSpeed training checks in real processes (run by tests/backends/test_deepspeed.py through `hasten launch`).

    deepspeed_train.py WORKDIR
Prints one `OK <check>` line per check that passed; any failure raises (the launch exits non-zero).
"""

import importlib.metadata
import importlib.util
import json
import os
import site
import sys
import tempfile

import torch
from deepspeed_common import (
    LR, PER_PROCESS, dataset, loader, loss_of, make_model, max_difference, reference, reset_state,
)

from hasten import Accelerator, DeepSpeedPlugin
from hasten.core.errors import ConfigError
from hasten.big_model.loading import load_checkpoint_in_model
from hasten.utils import DummyOptim, DummyScheduler

if importlib.util.find_spec("transformers") is not None:
    try:
        importlib.metadata.version("accelerate")
    except importlib.metadata.PackageNotFoundError:
        # transformers reaches hasten's DeepSpeed config only through an `accelerate` distribution, which it
        # checks when first imported: give this process hasten's alias from a throwaway folder (metadata and
        # import hook), as `hasten alias install` gives a virtual environment
        from hasten.commands.alias import install

        site.addsitedir(install(tempfile.mkdtemp(prefix="hasten-alias-")))

STEPS = 4
FP32_TOLERANCE = 1e-5  # partitioned flat buffers and a two-process all-reduce change float rounding only
BF16_TOLERANCE = 3e-2  # bf16 weights (8 bits of mantissa) against the fp32 reference, after 4 AdamW steps


def train(accelerator, model, optimizer, data, steps):
    losses, step = [], 0
    for x, y in data:
        with accelerator.accumulate(model):
            loss = loss_of(model, x, y)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            losses.append(accelerator.reduce(loss.detach(), "mean").item())
            step += 1
            if step == steps:
                break
    return losses


def check_matches_ddp(workdir):
    """ZeRO 1/2/3 x fp32/bf16 match the plain reference; bf16 loss curves agree across stages."""
    expected = reference(STEPS, num_processes=2)
    bf16_curves = {}
    for precision in ("no", "bf16"):
        for stage in (1, 2, 3):
            reset_state()
            accelerator = Accelerator(mixed_precision=precision,
                                      deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage, gradient_clipping=1.0))
            assert accelerator.mixed_precision == precision
            model = make_model()
            optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
            model, optimizer, data = accelerator.prepare(model, optimizer, loader())
            # Accelerate 1.15 on CPU: every rank thinks it is the main one and reads every batch. Not here.
            assert accelerator.is_main_process == (accelerator.process_index == 0)
            assert len(data) == len(dataset()) // (PER_PROCESS * 2), len(data)
            curve = train(accelerator, model, optimizer, data, STEPS)
            state = accelerator.get_state_dict(model)
            if accelerator.is_main_process:
                tolerance = FP32_TOLERANCE if precision == "no" else BF16_TOLERANCE
                difference = max_difference(state, expected)
                assert difference < tolerance, f"ZeRO-{stage} {precision}: differs from DDP by {difference}"
                if precision == "bf16":
                    assert all(t.dtype == torch.bfloat16 for t in state.values())
            if precision == "bf16":
                bf16_curves[stage] = curve
            if stage == 3 and precision == "no":
                check_zero3_save_model(accelerator, model, expected, workdir)
    for stage in (2, 3):
        for a, b in zip(bf16_curves[1], bf16_curves[stage]):
            assert abs(a - b) < 1e-3, f"bf16 loss curves of ZeRO-1 and ZeRO-{stage} differ: {bf16_curves}"
    print("OK matches_ddp", flush=True)


def check_zero3_save_model(accelerator, model, expected, workdir):
    """ZeRO-3: save_model gathers the whole weights; load_checkpoint_in_model reads them into a plain model."""
    target = os.path.join(workdir, "zero3_model")
    accelerator.save_model(model, target)
    if accelerator.is_main_process:
        from safetensors.torch import load_file

        saved = load_file(os.path.join(target, "model.safetensors"))
        assert max_difference(saved, expected) < FP32_TOLERANCE
        plain = make_model(seed=99)
        load_checkpoint_in_model(plain, target)
        assert max_difference(plain.state_dict(), saved) == 0.0
    # Every parameter is still managed (partitioned) by ZeRO-3 after the gather.
    assert all(hasattr(p, "ds_id") for p in model.parameters())
    from hasten.utils import GatheredParameters

    first = next(model.parameters())
    with GatheredParameters([first]):
        assert first.shape == expected["body.0.weight"].shape and first.numel() == expected["body.0.weight"].numel()
    with GatheredParameters(torch.nn.Linear(2, 2).parameters()):  # ordinary parameters: nothing to do
        pass
    print("OK zero3_save_model", flush=True)


def check_accumulation():
    """accumulate() with 2 micro-batches of 2 equals one batch of 4 (per process)."""
    reset_state()
    accelerator = Accelerator(gradient_accumulation_steps=2,
                              deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, gradient_clipping=1.0))
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    model, optimizer, data = accelerator.prepare(model, optimizer, loader(batch_size=PER_PROCESS // 2))
    assert accelerator.deepspeed_config["gradient_accumulation_steps"] == 2
    assert accelerator.deepspeed_config["train_micro_batch_size_per_gpu"] == PER_PROCESS // 2
    train(accelerator, model, optimizer, data, STEPS)
    state = accelerator.get_state_dict(model)
    difference = max_difference(state, reference(STEPS, num_processes=2))
    assert difference < FP32_TOLERANCE, f"accumulation differs from the larger batch by {difference}"
    try:  # DeepSpeed clips inside its step: a different max_norm cannot be honoured, so it is refused
        accelerator.clip_grad_norm_(model.parameters(), 0.5)
    except ConfigError as error:
        assert "gradient_clipping=1.0" in str(error) and "max_norm=0.5" in str(error), error
    else:
        raise AssertionError("clip_grad_norm_ with another max_norm than the config's must be refused")
    print("OK accumulation", flush=True)


AUTO_CONFIG = {
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto", "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True}},
    "scheduler": {"type": "WarmupDecayLR", "params": {
        "warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "zero_optimization": {
        "stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto", "stage3_gather_16bit_weights_on_model_save": "auto"},
}


def check_auto_config(workdir):
    """A transformers-style config with "auto" everywhere resolves to what prepare() saw."""
    path = os.path.join(workdir, "ds_auto.json")
    if int(os.environ.get("RANK", "0")) == 0:
        with open(path, "w") as handle:
            json.dump(AUTO_CONFIG, handle)
    torch.distributed.barrier()
    reset_state()
    accelerator = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=2,
                              deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=path))
    model = make_model()
    optimizer = DummyOptim(model.parameters(), lr=3e-3, weight_decay=0.01)
    scheduler = DummyScheduler(optimizer, total_num_steps=20, warmup_num_steps=3)
    model, optimizer, data, scheduler = accelerator.prepare(model, optimizer, loader(), scheduler)
    config = accelerator.deepspeed_config
    zero = config["zero_optimization"]
    got = {
        "micro": config["train_micro_batch_size_per_gpu"], "batch": config["train_batch_size"],
        "steps": config["gradient_accumulation_steps"], "clip": config["gradient_clipping"],
        "bf16": config["bf16"]["enabled"], "fp16": config["fp16"]["enabled"],
        "lr": config["optimizer"]["params"]["lr"], "wd": config["optimizer"]["params"]["weight_decay"],
        "sched": dict(config["scheduler"]["params"]), "buckets": (zero["reduce_bucket_size"],
        zero["stage3_prefetch_bucket_size"], zero["stage3_param_persistence_threshold"]),
        "gather": zero["stage3_gather_16bit_weights_on_model_save"],
    }
    want = {
        "micro": PER_PROCESS, "batch": PER_PROCESS * 2 * 2, "steps": 2, "clip": 1.0, "bf16": True, "fp16": False,
        "lr": 3e-3, "wd": 0.01, "buckets": (256, 230, 160), "gather": False,
        "sched": {"warmup_min_lr": 0, "warmup_max_lr": 3e-3, "warmup_num_steps": 3, "total_num_steps": 10},
    }
    assert got == want, f"auto values resolved to {got}, expected {want}"
    assert accelerator.mixed_precision == "bf16"
    train(accelerator, model, optimizer, data, 2)
    assert 0 < scheduler.get_last_lr()[0] <= 3e-3
    print("OK auto_config", flush=True)


def check_two_plugins():
    """Two models, two plugins (ZeRO-2 and ZeRO-3): each trains as the reference says."""
    reset_state()
    teacher_config = {"train_micro_batch_size_per_gpu": PER_PROCESS, "gradient_clipping": 1.0,
                      "zero_optimization": {"stage": 3}}
    plugins = {"student": DeepSpeedPlugin(zero_stage=2, gradient_clipping=1.0),
               "teacher": DeepSpeedPlugin(hf_ds_config=teacher_config)}
    accelerator = Accelerator(deepspeed_plugins=plugins)
    assert accelerator.deepspeed_plugin is plugins["student"]
    student = make_model(seed=0)
    student_opt = torch.optim.AdamW(student.parameters(), lr=LR)
    student, student_opt, data = accelerator.prepare(student, student_opt, loader())
    accelerator.state.select_deepspeed_plugin("teacher")
    assert accelerator.deepspeed_plugin is plugins["teacher"] and not plugins["student"].selected
    teacher = make_model(seed=1)
    teacher_opt = torch.optim.AdamW(teacher.parameters(), lr=LR)
    teacher, teacher_opt = accelerator.prepare(teacher, teacher_opt)
    assert teacher.zero_optimization_stage() == 3 and student.zero_optimization_stage() == 2
    for step, (x, y) in enumerate(data):
        if step == STEPS:
            break
        for model, optimizer in ((student, student_opt), (teacher, teacher_opt)):
            accelerator.backward(loss_of(model, x, y))
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
    accelerator.state.select_deepspeed_plugin("student")
    for name, model, seed in (("student", student, 0), ("teacher", teacher, 1)):
        state = accelerator.get_state_dict(model)
        if accelerator.is_main_process:
            difference = max_difference(state, reference(STEPS, num_processes=2, seed=seed))
            assert difference < FP32_TOLERANCE, f"{name} differs from its reference by {difference}"
    try:
        accelerator.backward(loss_of(student, *dataset()[:2]) + loss_of(teacher, *dataset()[:2]))
    except ConfigError as error:
        assert "flows into 2 DeepSpeed models" in str(error)
    else:
        raise AssertionError("a loss of two engines must be refused")
    print("OK two_plugins", flush=True)


def check_zero3_init():
    """zero3_init_flag: transformers builds the model already partitioned (each process holds no full weight);
    zero3_init_context_manager(enable=False) builds a whole one; the partitioned model trains."""
    from transformers import GPT2Config, GPT2LMHeadModel  # a test dependency (scripts/test.sh): missing fails
    reset_state()
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3, gradient_clipping=1.0))
    assert accelerator.deepspeed_plugin.zero3_init_flag
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=32)
    model = GPT2LMHeadModel._from_config(config)
    weight = model.transformer.wte.weight
    assert hasattr(weight, "ds_id") and weight.numel() == 0 and weight.ds_numel == 128 * 32
    with accelerator.deepspeed_plugin.zero3_init_context_manager(enable=False):
        whole = GPT2LMHeadModel._from_config(config)
    assert not hasattr(whole.transformer.wte.weight, "ds_id") and whole.transformer.wte.weight.numel() == 128 * 32
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 128, (16, 8), generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=4)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    losses = []
    for (x,) in data:
        loss = model(input_ids=x, labels=x).loss
        accelerator.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    state = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        assert state["transformer.wte.weight"].shape == (128, 32)
    assert all(l == l for l in losses) and losses[-1] < losses[0] + 1.0
    print("OK zero3_init", flush=True)


if __name__ == "__main__":
    workdir = sys.argv[1]
    check_matches_ddp(workdir)
    check_accumulation()
    check_auto_config(workdir)
    check_two_plugins()
    check_zero3_init()  # last: transformers keeps the ZeRO-3 config registered for the rest of the process
