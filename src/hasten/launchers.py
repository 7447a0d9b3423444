"""Start several processes from Python (a notebook, a test): `notebook_launcher` and `debug_launcher`.

Both go through torchrun's elastic agent with the fork start method, so functions defined in a notebook
need not be importable.
"""

from __future__ import annotations

import os
import uuid

from .core.enums import PrecisionType
from .core.errors import ConfigError, LaunchError


def _run_forked(record_dir, function, *args):
    """Body of each forked process: forget the parent's state, run, then tear the process group down.

    A failure is written to `record_dir/<rank>.json` with a precise time: torch's process context reports
    only the first process it notices, which is often a rank that merely lost contact with the real culprit.
    """
    from .distributed import departures
    from .state import AcceleratorState, GradientState

    # A fork copies the parent's shared state; this process is a different rank and must detect its own.
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    # A peer may end its function without building any state; joining the group then fails at once, naming it.
    departures.watched = True
    try:
        return function(*args)
    except BaseException as error:
        _record_failure(record_dir, error)
        raise
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        departures.announce_departure()


# What torchrun gives each process to find its rank. Accelerate's debug_launcher sets none of them (only
# WORLD_SIZE), so there one process is `DistributedType.NO`; a one-process debug launch here drops them too.
_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "LOCAL_WORLD_SIZE", "ROLE_WORLD_SIZE",
                   "GROUP_WORLD_SIZE")


def _run_forked_alone(record_dir, function, *args):
    """`_run_forked` for a one-process `debug_launcher`: the function sees a plain single process."""
    for name in _RANK_VARIABLES:
        os.environ.pop(name, None)
    return _run_forked(record_dir, function, *args)


def _record_failure(record_dir: str, error: BaseException) -> None:
    import json
    import time

    from .core.env import parse_int
    from .resilience.error_file import PEER_LOSS_MARKERS

    message = (f"{type(error).__name__}: {error}".strip().splitlines() or [""])[0][:300]
    record = {
        "rank": parse_int(os.environ.get("RANK", "0")),
        "local_rank": parse_int(os.environ.get("LOCAL_RANK", "0")),
        "time": time.time(),
        "message": message,
        "peer_loss": any(marker in message.lower() for marker in PEER_LOSS_MARKERS),
    }
    try:
        with open(os.path.join(record_dir, f"{record['rank']}.json"), "w") as file:
            json.dump(record, file)
    except OSError:
        pass


def _describe_recorded_failures(record_dir: str) -> str | None:
    """One line naming the rank that failed first, from the records `_run_forked` wrote."""
    import json

    records = []
    for name in os.listdir(record_dir):
        try:
            with open(os.path.join(record_dir, name)) as file:
                records.append(json.load(file))
        except (OSError, ValueError):
            continue
    if not records:
        return None
    records.sort(key=lambda r: (r["peer_loss"], r["time"], r["rank"]))
    root = records[0]
    text = f"rank {root['rank']} (local rank {root['local_rank']}) failed: {root['message']}"
    if root["peer_loss"]:
        # Only consequences were recorded: the culprit died without a Python exception (killed, os._exit).
        text = f"a process died without a Python error; rank {root['rank']} then lost contact with it"
    others = [str(r["rank"]) for r in records[1:]]
    if others:
        text += f"; then rank{'s' if len(others) > 1 else ''} {', '.join(others)} failed too"
    return text


def _launch_function(function, args, nproc, env, *, master_addr, port, node_rank=0, num_nodes=1,
                     rdzv_backend="static", rdzv_endpoint="", rdzv_conf=None, rdzv_id="none",
                     max_restarts=0, monitor_interval=0.1, log_line_prefix_template=None, body=None):
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    rdzv_conf = dict(rdzv_conf or {})
    if rdzv_backend == "static":
        rdzv_conf["rank"] = node_rank
    if not rdzv_endpoint:
        rdzv_endpoint = f"{master_addr}:{port}"
    config = LaunchConfig(
        min_nodes=num_nodes,
        max_nodes=num_nodes,
        nproc_per_node=nproc,
        run_id=rdzv_id if num_nodes > 1 else str(uuid.uuid4()),
        rdzv_endpoint=rdzv_endpoint,
        rdzv_backend=rdzv_backend,
        rdzv_configs=rdzv_conf,
        max_restarts=max_restarts,
        monitor_interval=monitor_interval,
        start_method="fork",
        log_line_prefix_template=log_line_prefix_template,
    )
    import tempfile

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    record_dir = tempfile.TemporaryDirectory(prefix="hasten-launch-")
    try:
        return elastic_launch(config, body or _run_forked)(record_dir.name, function, *args)
    except ChildFailedError as error:
        from .core.errors import LaunchedFunctionError
        from .launch.run import _describe_failures

        described = _describe_recorded_failures(record_dir.name) or _describe_failures(error)
        # A LaunchError, and the ChildFailedError Accelerate's launchers raise (scripts catch that), in one line.
        raise LaunchedFunctionError(f"launched function failed: {described}", error.name, error.failures) from None
    finally:
        record_dir.cleanup()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def test_launch():
    """Check that this process can set up its distributed state (what `accelerate test` first runs)."""
    from .state import PartialState

    return PartialState()


def notebook_launcher(function, args=(), num_processes=None, mixed_precision="no", use_port="29500",
                      master_addr="127.0.0.1", node_rank=0, num_nodes=1, rdzv_backend="static", rdzv_endpoint="",
                      rdzv_conf=None, rdzv_id="none", max_restarts=0, monitor_interval=0.1,
                      log_line_prefix_template=None):
    """Run `function(*args)` on `num_processes` processes of this machine (in this process if 1)."""
    if str(mixed_precision).lower() not in PrecisionType:
        raise ConfigError(f"Unknown mixed_precision {mixed_precision!r}; choose one of {PrecisionType.list()}")
    if num_processes is None:
        raise ConfigError("notebook_launcher needs num_processes (e.g. num_processes=2)")
    if node_rank >= num_nodes:
        raise ConfigError(f"node_rank {node_rank} must be below num_nodes {num_nodes}")
    # Unlike Accelerate 1.15 (which exported an unread MIXED_PRECISION), the choice reaches the processes.
    env = {"HASTEN_MIXED_PRECISION": str(mixed_precision).lower()}
    if _on_xla_device():
        return _launch_xla(function, args, num_processes, env)
    if num_processes == 1:
        saved = os.environ.get("HASTEN_MIXED_PRECISION")
        os.environ.update(env)
        try:
            return function(*args)
        finally:
            if saved is None:
                os.environ.pop("HASTEN_MIXED_PRECISION", None)
            else:
                os.environ["HASTEN_MIXED_PRECISION"] = saved
    from .state import AcceleratorState

    if AcceleratorState._shared_state:
        raise LaunchError(
            "An Accelerator already exists in this process; notebook_launcher must start before any "
            "`Accelerator()` is created. Restart the notebook kernel and launch first."
        )
    try:
        port = int(use_port)
    except ValueError:
        raise ConfigError(f"use_port={use_port!r} is not a port number (e.g. '29500', or '0' for any free port)") from None
    if port == 0:
        from .launch.machine import get_free_port

        port = get_free_port()
    return _launch_function(
        function, args, num_processes, env, master_addr=master_addr, port=port, node_rank=node_rank,
        num_nodes=num_nodes, rdzv_backend=rdzv_backend, rdzv_endpoint=rdzv_endpoint, rdzv_conf=rdzv_conf,
        rdzv_id=rdzv_id, max_restarts=max_restarts, monitor_interval=monitor_interval,
        log_line_prefix_template=log_line_prefix_template,
    )


def _on_xla_device() -> bool:
    """A notebook on an XLA device (PJRT_DEVICE set, torch_xla installed). Accelerate asks for Colab or Kaggle
    too, and elsewhere starts torch processes that are each an XLA world of their own."""
    from .core.availability import is_torch_xla_available

    return bool(os.environ.get("PJRT_DEVICE") or os.environ.get("TPU_NAME")) and is_torch_xla_available()


def _launch_xla(function, args, num_processes, env):
    import importlib

    from .launch.tpu import Replica, spawn
    from .state import AcceleratorState

    if AcceleratorState._shared_state:
        raise LaunchError(
            "To train on TPU in Colab or Kaggle Kernel, the `Accelerator` should only be initialized inside your "
            "training function. Restart your notebook and make sure no cells initializes an `Accelerator`."
        )
    print("Launching a training on TPU cores.")
    xmp = importlib.import_module("torch_xla.distributed.xla_multiprocessing")
    return spawn(xmp, Replica(function), tuple(args), num_processes, env,
                 start_method="fork")


def debug_launcher(function, args=(), num_processes=2):
    """Run `function(*args)` on `num_processes` CPU processes (gloo), for tests and debugging."""
    from .launch.machine import get_free_port

    env = {"HASTEN_USE_CPU": "true", "HASTEN_MIXED_PRECISION": "no"}
    body = _run_forked_alone if num_processes == 1 else None  # one process: not distributed, as in Accelerate
    return _launch_function(function, args, num_processes, env, master_addr="127.0.0.1", port=get_free_port(),
                            body=body)
