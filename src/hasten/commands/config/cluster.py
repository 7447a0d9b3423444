"""The questions of `hasten config` for a machine (Accelerate's `commands.config.cluster`).

Which questions are asked depends on the answers so far (a one-process run needs no rendezvous); each question's
text, allowed values and answer check come from the settings table (`hasten.config.settings`).
"""

from __future__ import annotations

from ...config import file as config_file
from .config_utils import Questions

_KIND_LABELS = {
    "NO": "No distributed training (one process)",
    "MULTI_CPU": "Several CPU processes",
    "MULTI_GPU": "Several GPUs, one process each ({count} {device} found)",
    "FSDP": "Several GPUs with the model sharded (FSDP)",
    "DEEPSPEED": "DeepSpeed ZeRO (GPUs, or CPU processes for testing; pip install \"hasten[deepspeed]\")",
}


def questionnaire(questions: Questions, machine: dict, existing: dict | None = None) -> dict:
    """The config a user builds by answering; defaults come from this machine (and an existing file)."""
    existing = existing or {}
    count, device = machine["device_count"], machine["device"]
    has_gpu = device != "cpu" and count > 0
    kinds = ["NO", "MULTI_CPU"] + (["MULTI_GPU", "FSDP"] if has_gpu else []) + ["DEEPSPEED"]
    start = existing.get("distributed_type") or ("MULTI_GPU" if has_gpu and count > 1 else "NO")
    labels = {kind: text.format(count=count, device=device) for kind, text in _KIND_LABELS.items()}
    kind = questions.setting("distributed_type", start, options=kinds, labels=labels)

    config = {"compute_environment": "LOCAL_MACHINE", "distributed_type": kind}
    config["use_cpu"] = kind in ("NO", "MULTI_CPU") + (() if has_gpu else ("DEEPSPEED",)) and (
        not has_gpu or questions.setting("use_cpu", bool(existing.get("use_cpu", False)))
    )
    if kind == "NO":
        config["num_processes"] = 1
    else:
        machines = questions.setting("num_machines", existing.get("num_machines", 1))
        config["num_machines"] = machines
        if machines > 1:
            config["machine_rank"] = questions.ask(
                f"Rank of this machine (0 to {machines - 1}; 0 is the main one)", existing.get("machine_rank", 0),
                lambda t: _rank(t, machines))
            config["main_process_ip"] = questions.setting("main_process_ip", existing.get("main_process_ip"))
            config["main_process_port"] = questions.setting("main_process_port", existing.get("main_process_port", 29500))
            config["rdzv_backend"] = questions.setting(
                "rdzv_backend", existing.get("rdzv_backend", "static"), options=["static", "c10d"],
                labels={"static": "static: fixed machine ranks", "c10d": "c10d: torchrun's elastic rendezvous"})
            config["same_network"] = questions.setting("same_network", bool(existing.get("same_network", True)))
        per_machine = count if has_gpu and kind != "MULTI_CPU" else 2
        default_total = existing.get("num_processes") if existing.get("num_processes", -1) > 0 else per_machine * machines
        config["num_processes"] = questions.setting("num_processes", default_total, parse=lambda t: _total(t, machines))
        if kind in ("MULTI_GPU", "FSDP") or kind == "DEEPSPEED" and has_gpu:
            config["gpu_ids"] = questions.setting("gpu_ids", existing.get("gpu_ids", "all"))
    if kind == "FSDP":
        config["fsdp_config"] = _fsdp_questions(questions, existing.get("fsdp_config") or {})
    if kind == "DEEPSPEED":
        config["deepspeed_config"] = _deepspeed_questions(questions, existing.get("deepspeed_config") or {})
    dynamo = existing.get("dynamo_config") or {}
    if questions.yes_no("Compile the model with torch.compile (dynamo)?", dynamo.get("dynamo_backend", "no") != "no"):
        backend = questions.setting(
            "dynamo_backend", "inductor", options=["inductor", "eager", "aot_eager", "cudagraphs"],
            labels={"inductor": "inductor (default)"})
        config["dynamo_config"] = {
            "dynamo_backend": backend,
            "dynamo_mode": questions.setting("dynamo_mode", "default"),
            "dynamo_use_fullgraph": questions.setting("dynamo_use_fullgraph", False),
            "dynamo_use_dynamic": questions.setting("dynamo_use_dynamic", False),
        }
    if kind != "NO":
        config["debug"] = questions.setting("debug", bool(existing.get("debug", False)))
    config["mixed_precision"] = questions.setting(
        "mixed_precision", existing.get("mixed_precision", "no"), labels={"no": "no (fp32)"})
    return config


def get_cluster_input() -> dict:
    """Ask every question on this terminal (Accelerate's name); returns the config mapping."""
    return questionnaire(Questions(), config_file.detect_machine())


def _rank(text, machines):
    from ...core.env import parse_int

    value = parse_int(text, 0)
    if value >= machines:
        raise ValueError(f"give 0 to {machines - 1}")
    return value


def _total(text, machines):
    from ...core.env import parse_int

    value = parse_int(text, 1)
    if value % machines:
        raise ValueError(f"the total must divide evenly over {machines} machines")
    return value


def _fsdp_questions(questions: Questions, existing: dict) -> dict:
    fsdp = {"fsdp_version": questions.setting(
        "fsdp_version", existing.get("fsdp_version", 2), options=[2, 1],
        labels={2: "FSDP2 (fully_shard, recommended)", 1: "FSDP1"})}
    fsdp["fsdp_reshard_after_forward"] = questions.yes_no(
        questions_text("fsdp_reshard_after_forward"), existing.get("fsdp_reshard_after_forward", True) is not False)
    fsdp["fsdp_offload_params"] = questions.setting("fsdp_offload_params", bool(existing.get("fsdp_offload_params", False)))
    policy = questions.setting(
        "fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP",
        labels={"TRANSFORMER_BASED_WRAP": "by transformer layer class", "SIZE_BASED_WRAP": "by parameter count",
                "NO_WRAP": "one shard group"})
    fsdp["fsdp_auto_wrap_policy"] = policy
    if policy == "TRANSFORMER_BASED_WRAP":
        fsdp["fsdp_transformer_layer_cls_to_wrap"] = questions.ask(
            questions_text("fsdp_transformer_layer_cls_to_wrap"),
            existing.get("fsdp_transformer_layer_cls_to_wrap", ""), str) or None
    elif policy == "SIZE_BASED_WRAP":
        fsdp["fsdp_min_num_params"] = questions.setting("fsdp_min_num_params",
                                                        existing.get("fsdp_min_num_params", 100_000_000))
    fsdp["fsdp_state_dict_type"] = questions.setting(
        "fsdp_state_dict_type", "SHARDED_STATE_DICT", options=["SHARDED_STATE_DICT", "FULL_STATE_DICT"],
        labels={"SHARDED_STATE_DICT": "sharded (each rank its part)", "FULL_STATE_DICT": "full (one file on rank 0)"})
    fsdp["fsdp_cpu_ram_efficient_loading"] = questions.setting(
        "fsdp_cpu_ram_efficient_loading", bool(existing.get("fsdp_cpu_ram_efficient_loading", False)))
    if fsdp["fsdp_cpu_ram_efficient_loading"]:
        fsdp["fsdp_sync_module_states"] = True
    fsdp["fsdp_activation_checkpointing"] = questions.setting(
        "fsdp_activation_checkpointing", bool(existing.get("fsdp_activation_checkpointing", False)))
    return {k: v for k, v in fsdp.items() if v is not None}


def _deepspeed_questions(questions: Questions, existing: dict) -> dict:
    """A DeepSpeed JSON file, or the plugin's main fields (each question's text and check from the table)."""
    path = questions.setting("deepspeed_config_file", existing.get("deepspeed_config_file", ""))
    if path:
        ds = {"deepspeed_config_file": path}
    else:
        stage = questions.setting("zero_stage", existing.get("zero_stage", 2), options=[0, 1, 2, 3],
                                  labels={2: "2: shard optimizer state and gradients (default)",
                                          3: "3: also shard the parameters"})
        ds = {"zero_stage": stage}
        offloads = ["none", "cpu", "nvme"]
        if stage >= 2:
            ds["offload_optimizer_device"] = questions.setting(
                "offload_optimizer_device", existing.get("offload_optimizer_device", "none"), options=offloads)
        if stage == 3:
            ds["offload_param_device"] = questions.setting(
                "offload_param_device", existing.get("offload_param_device", "none"), options=offloads)
        ds["gradient_accumulation_steps"] = questions.setting(
            "gradient_accumulation_steps", existing.get("gradient_accumulation_steps", 1))
        ds["gradient_clipping"] = questions.setting("gradient_clipping", existing.get("gradient_clipping", 1.0))
    if ds.get("zero_stage") == 3 or path:
        ds["zero3_init_flag"] = questions.setting("zero3_init_flag", bool(existing.get("zero3_init_flag", False)))
    return ds


def questions_text(name: str) -> str:
    from ...config.settings import get

    return get(name).question
