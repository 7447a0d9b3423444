"""Joining the job's process group: the store and its per-attempt key space, the one collective timeout, a
barrier that waits until every process has joined, and tearing down at exit (with gloo's worker threads).
"""

from __future__ import annotations

import atexit
import os
from datetime import timedelta

from ..core.env import gloo_interface_words
from ..resilience.error_file import record_uncaught_errors
from . import cluster as environment
from . import control, departures


def init_process_group(cluster: environment.ClusterInfo, backend: str, kwargs: dict) -> None:
    """Join the job's process group, in a key space of its own for every torchelastic restart.

    Measured with torch 2.13 + gloo: a restarted attempt that reuses the agent's store often reads the keys of
    the attempt before it and fails or hangs; a per-attempt prefix made every restart work.
    """
    import torch.distributed as dist

    from ..resilience.orphans import watch_launcher

    watch_launcher()  # a worker of `hasten launch` ends with it (a killed launcher leaves no orphan on the GPUs)
    timeout = collective_timeout(kwargs.pop("timeout", None), backend)
    gloo_interface_from_nccl()
    if kwargs.get("init_method") is not None:
        dist.init_process_group(backend, rank=cluster.rank, world_size=cluster.world_size, timeout=timeout, **kwargs)
        if backend == "gloo":
            dist.barrier()  # collective-ok: the group is gloo here; see _wait_for_every_process
        control.control_group(timeout)  # every rank makes the control group here, at the same point
        return
    addr = cluster.master_addr or "127.0.0.1"
    port = cluster.master_port or 29500
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        store = dist.TCPStore(addr, port, cluster.world_size, is_master=False, timeout=timeout)
    else:
        store = dist.TCPStore(
            addr, port, cluster.world_size, is_master=cluster.rank == 0, timeout=timeout, multi_tenant=True
        )
    store = departures.attempt_store(store)
    if departures.watched:
        departures.wait_for_arrivals(store, cluster.rank, cluster.world_size, timeout)
    dist.init_process_group(
        backend, store=store, rank=cluster.rank, world_size=cluster.world_size, timeout=timeout, **kwargs
    )
    _wait_for_every_process(store, cluster.world_size, timeout)
    # The control plane: on NCCL (or any backend that serves no CPU tensor) a gloo group beside the default one,
    # made now so that every rank makes it at the same point (see distributed/control.py).
    _make_control_group(timeout)
    # A gloo group left alive at interpreter exit aborts the process about half the time with torch 2.13;
    # tearing down what we set up makes a correct script exit 0 even if it never calls destroy_process_group.
    atexit.register(destroy_default_group)
    record_uncaught_errors()


def gloo_interface_from_nccl(env=None) -> str | None:
    """Set `GLOO_SOCKET_IFNAME` from `NCCL_SOCKET_IFNAME` when only the latter is set; returns what gloo will use.

    Why: every NCCL job also builds a gloo group (the control plane, or `"cuda:nccl,cpu:gloo"`), and gloo picks
    its interface from the hostname, which on a multi-homed node can be one the other machines cannot reach:
    start-up then hangs until the collective timeout. The interface the user gave NCCL is the one that works.
    NCCL's form is a list of name prefixes (`eth`, `=eth0` exact, `^docker` excluded); gloo wants exact names, so
    prefixes are matched against this machine's interfaces and an exclusion list is left to the user.
    """
    env = os.environ if env is None else env
    if env.get("GLOO_SOCKET_IFNAME"):
        return env["GLOO_SOCKET_IFNAME"]
    nccl = env.get("NCCL_SOCKET_IFNAME", "").strip()
    if not nccl or nccl.startswith("^"):
        return None
    exact = nccl.startswith("=")
    wanted = [name.strip() for name in nccl.lstrip("=").split(",") if name.strip()]
    try:
        import socket

        present = [name for _, name in socket.if_nameindex()]
    except OSError:
        present = []
    chosen = [name for name in present if any(name == w if exact else name.startswith(w) for w in wanted)]
    if not chosen:
        return None
    env["GLOO_SOCKET_IFNAME"] = ",".join(chosen)
    return env["GLOO_SOCKET_IFNAME"]


def _make_control_group(timeout) -> None:
    """The control group, with the interface named if gloo cannot connect (a wrong interface hangs here)."""
    try:
        control.control_group(timeout)
    except RuntimeError as error:
        from ..core.errors import DistributedOperationException

        raise DistributedOperationException(
            f"the gloo control group beside the default group could not connect: {error}; {gloo_interface_words()}."
            " Fix: set GLOO_SOCKET_IFNAME (or NCCL_SOCKET_IFNAME) to the interface the machines reach each other on"
        ) from error


NCCL_DEFAULT_TIMEOUT = 600.0  # torch's own default for NCCL groups, which Accelerate keeps when nothing is set


def collective_timeout(code=None, backend: str | None = None) -> timedelta:
    """The one collective timeout (gloo, NCCL, DeepSpeed and the hang doctor): `InitProcessGroupKwargs(timeout=)`
    in code, else `HASTEN_COLLECTIVE_TIMEOUT` / `--collective_timeout` / the config file, else the default:
    600 s for NCCL (torch's, as under Accelerate), 1800 s for gloo."""
    if isinstance(code, timedelta):
        code = code.total_seconds()
    from ..config.resolve import runtime_value

    resolved = runtime_value("collective_timeout", code)
    if resolved.source == "default" and backend is not None and "nccl" in str(backend):
        return timedelta(seconds=NCCL_DEFAULT_TIMEOUT)
    return timedelta(seconds=float(resolved.value))


def _wait_for_every_process(store, world_size: int, timeout) -> None:
    """Return only once every process has finished joining the group.

    gloo's `init_process_group` can return on one process while another is still connecting to it. Measured
    with torch 2.13 on a loaded 2-core machine: a 2-process script that exits right after `Accelerator()` failed
    in about 1 launch in 13 with `Gloo connectFullMesh failed with ... Connection closed by peer` on the late
    process. A store barrier (no collective, so no device is touched) closes that window.
    """
    global _joins
    if world_size <= 1:
        return
    _joins += 1  # a group made again in the same processes (after destroy_process_group) gets its own keys
    if store.add(f"hasten/joined{_joins}", 1) == world_size:
        store.set(f"hasten/all_joined{_joins}", "1")
    store.wait([f"hasten/all_joined{_joins}"], timeout)


_joins = 0


def destroy_default_group() -> None:
    """At interpreter exit: destroy the group hasten made, then let gloo's worker threads finish (see below)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
    control.reset()
    wait_for_gloo_workers()


GLOO_WORKER_THREAD = "pt_gloo_runloop"  # the name torch gives ProcessGroupGloo's worker threads (Linux)


def wait_for_gloo_workers(timeout: float = 10.0) -> bool:
    """Block, with the GIL released, until no gloo worker thread still has to drop a finished operation.

    Why: a gloo worker thread drops its reference to each collective only after the caller was told it finished.
    When that reference is the last one to a tensor made in Python, dropping it takes the GIL. If the interpreter
    has begun finalizing by then, CPython ends the thread with pthread_exit, whose unwinding crosses a noexcept
    destructor: `terminate called without an active exception`, SIGABRT. destroy_process_group does not stop
    the threads while anything else (DDP, a device mesh, FSDP) still holds the group, and under load a worker
    thread can wait long enough for a script that ends right after a collective to reach finalization first
    (measured: 1 in 12 launches of a short DDP script on a loaded 2-core machine; 3 of 3 plain-torch runs with the
    worker threads starved; see docs/launch.md).

    Idle means: every worker thread is asleep and none woke up across a short sleep of ours (a thread waiting for
    the GIL wakes up when we release it). Returns False if that was not seen within `timeout` seconds (or True at
    once when there are no gloo worker threads, or the platform has no /proc).
    """
    import time

    deadline = time.monotonic() + timeout
    before = gloo_worker_activity()
    while before:
        time.sleep(0.002)
        after = gloo_worker_activity()
        if after == before and all(state == "S" for state, _ in after.values()):
            return True
        if time.monotonic() > deadline:
            return False
        before = after
    return True


def gloo_worker_activity() -> dict:
    """{thread id: (state letter, context switches so far)} of this process's gloo worker threads (Linux /proc)."""
    activity = {}
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return activity
    for tid in threads:
        try:
            with open(f"/proc/self/task/{tid}/status") as file:
                fields = dict(line.split(":", 1) for line in file.read().splitlines() if ":" in line)
        except OSError:  # the thread ended meanwhile
            continue
        if fields.get("Name", "").strip() != GLOO_WORKER_THREAD:
            continue
        switches = sum(int(fields.get(key, "0")) for key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"))
        activity[tid] = (fields.get("State", "?").split()[0], switches)
    return activity


def init_single_process_group() -> None:
    """A one-process gloo group, so that a plain `python train.py` can run (and resume) models whose engine needs
    a group (FSDP, DeepSpeed)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    atexit.register(destroy_default_group)  # also lets gloo's worker threads finish before the interpreter ends
