"""Checkpoints to object storage: what a save to s3:// costs, against the store library's own upload, and how long
an asynchronous save to s3:// blocks the training loop, against one to a local folder.

A moto S3 server runs in a process of its own on localhost (so its work does not share this process's interpreter
lock); the client is s3fs, reached through `AWS_ENDPOINT_URL` as AWS would be. One process holds a model and its
AdamW state (the moments exist: one step was taken), `--size-mb` in all (default 1024: weights are a third of it).

(a) *Save*: hasten's `save_state` to `s3://bucket/...` (stage locally, upload every file in parallel, write the
    manifest) against s3fs's own `put(folder, recursive=True)` of the same files already on disk (a folder
    hasten's local `save_state` wrote). Ratio = s3fs put time / hasten time (1.0: hasten is as fast as the upload
    alone; the target is >= 0.9, which leaves hasten ~10% for writing the staged files and the commit).
(c) *Sharded*: a DCP folder (what FSDP/TP/PP save) written straight into the bucket by the storage layer (every
    file a multipart upload stream, `storage_workers` at once, nothing on the local disk), against s3fs's put of
    the same folder already on disk, and against staging it first (`dcp.save` to disk, then the put).
(b) *Blocked*: the time the training loop waits for `save_state(async_save=True)`: the call plus what the next
    optimizer step waits for the staging copy (hasten's counter), to s3:// against to a local folder. The
    background upload then finishes before the next round (`wait_for_checkpoint`). Ratio = s3:// / local
    (target <= 1.1).
Sides alternate (ABAB...); medians of `--repeats`. Every round deletes what it wrote. The load average is printed:
on a shared machine the numbers move with it.
Run: `python -m benchmarks.remote_checkpoint [--quick] [--size-mb 1024] [--repeats 3]`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import Table, base_parser, fmt_time, interleave, median, print_tables, ratio

BUCKET = "hasten-bench"
_SERVER = ("import sys, time; from moto.server import ThreadedMotoServer; "
           "s = ThreadedMotoServer(ip_address='127.0.0.1', port=int(sys.argv[1])); s.start(); "
           "print('ready', flush=True); time.sleep(10**9)")


def start_server():
    """A moto S3 server in its own process on a free port: (process, endpoint URL)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-c", _SERVER, str(port)], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    for line in process.stdout:  # moto says a line of its own first
        if line.strip() == "ready":
            break
    else:
        raise RuntimeError("the moto server did not start (pip install 'moto[server]')")
    return process, f"http://127.0.0.1:{port}"


def client_env(endpoint: str, staging: str) -> None:
    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
                       "AWS_ENDPOINT_URL": endpoint, "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
                       "AWS_CONFIG_FILE": "/nonexistent", "AWS_EC2_METADATA_DISABLED": "true",
                       "HASTEN_STAGING_DIR": staging})


def model_and_optimizer(size_mb: int):
    import torch

    width = 2048 if size_mb >= 48 else 256
    layers = max(1, round(size_mb / 3 * 2**20 / (width * width * 4)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()
    return model, optimizer, width


def folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(folder) for name in names)


def run(size_mb: int, repeats: int) -> list:
    import s3fs
    import torch

    from hasten import Accelerator
    from hasten.checkpoint import async_save as background

    work = tempfile.mkdtemp(prefix="hasten-remote-bench-")
    server, endpoint = start_server()
    try:
        client_env(endpoint, os.path.join(work, "staging"))
        fs = s3fs.S3FileSystem()
        fs.mkdir(BUCKET)
        torch.manual_seed(0)
        model, optimizer, width = model_and_optimizer(size_mb)
        accelerator = Accelerator(cpu=True)
        model, optimizer = accelerator.prepare(model, optimizer)
        x = torch.randn(64, width)
        counter = iter(range(10**6))

        staged = os.path.join(work, "staged")
        accelerator.save_state(staged)  # the same files hasten uploads, for s3fs's own put
        state_bytes, state_files = folder_bytes(staged), sum(len(n) for _, _, n in os.walk(staged))

        def timed(action) -> float:
            start = time.perf_counter()
            action()
            return time.perf_counter() - start

        def hasten_save() -> float:
            url = f"s3://{BUCKET}/hasten/ckpt_{next(counter)}"
            seconds = timed(lambda: accelerator.save_state(url))
            fs.rm(url, recursive=True)
            return seconds

        def put_of(folder: str, under: str):
            """s3fs's own recursive put of `folder` (already on disk), timed, then removed from the bucket."""
            def put() -> float:
                key = f"{BUCKET}/{under}/ckpt_{next(counter)}"
                seconds = timed(lambda: fs.put(folder + "/", key, recursive=True))
                fs.rm(key, recursive=True)
                return seconds
            return put

        s3fs_put = put_of(staged, "put")

        def blocked(target) -> float:
            waited = background.waited_for_staging[0]
            start = time.perf_counter()
            accelerator.save_state(target, async_save=True)
            call = time.perf_counter() - start
            accelerator.backward(model(x).pow(2).mean())
            optimizer.step()  # waits for the staging copy, if it is not done
            optimizer.zero_grad()
            seconds = call + background.waited_for_staging[0] - waited
            accelerator.wait_for_checkpoint()
            return seconds

        def async_remote() -> float:
            url = f"s3://{BUCKET}/async/ckpt_{next(counter)}"
            seconds = blocked(url)
            fs.rm(url, recursive=True)
            return seconds

        def async_local() -> float:
            folder = os.path.join(work, f"async_{next(counter)}")
            seconds = blocked(folder)
            shutil.rmtree(folder)
            return seconds

        # (c) sharded state: a DCP folder written straight into the bucket by the layer, against s3fs's put of the
        # same folder already on disk, and against staging it first (dcp.save to disk, then the put)
        import torch.distributed.checkpoint as dcp

        from hasten.checkpoint import remote_checkpoints
        from hasten.checkpoint.storage import dcp as layer_dcp
        from hasten.checkpoint.storage import into_store
        from hasten.checkpoint.storage import storage_for

        sharded = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        dcp_folder = os.path.join(work, "dcp")
        dcp.save(sharded, checkpoint_id=dcp_folder)
        dcp_bytes = folder_bytes(dcp_folder)
        store = storage_for(f"s3://{BUCKET}/direct")

        def dcp_direct() -> float:
            prefix, local = f"v{next(counter)}", os.path.join(work, "direct-bookkeeping")
            into_store.write_into(local, store, prefix, remote_checkpoints.workers())
            try:
                seconds = timed(lambda: layer_dcp.save(sharded, os.path.join(local, "state")))
            finally:
                into_store.stop_writing_into(local)
            shutil.rmtree(local, ignore_errors=True)
            fs.rm(f"{BUCKET}/direct/{prefix}", recursive=True)
            return seconds

        dcp_put = put_of(dcp_folder, "dcp-put")

        def dcp_staged() -> float:
            folder, key = os.path.join(work, "dcp-staged"), f"{BUCKET}/dcp-staged/ckpt_{next(counter)}"
            seconds = timed(lambda: (dcp.save(sharded, checkpoint_id=folder), fs.put(folder + "/", key, recursive=True)))
            shutil.rmtree(folder, ignore_errors=True)
            fs.rm(key, recursive=True)
            return seconds

        save = interleave({"hasten save_state to s3://": hasten_save, "s3fs put of the staged folder": s3fs_put},
                          repeats)
        direct = interleave({"DCP straight into s3:// (hasten's layer)": dcp_direct,
                             "s3fs put of the same DCP folder on disk": dcp_put,
                             "dcp.save to disk, then s3fs put": dcp_staged}, repeats)
        block = interleave({"async to s3://": async_remote, "async to a local folder": async_local}, repeats)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        shutil.rmtree(work, ignore_errors=True)

    load = "/".join(f"{v:.2f}" for v in os.getloadavg())
    gb = state_bytes / 2**30
    first = Table("Save to s3:// vs s3fs's own put of the same files", ["side", "median", "GB/s", "ratio (put / side)"])
    put = median(save["s3fs put of the staged folder"])
    for name, samples in save.items():
        first.rows.append([name, fmt_time(median(samples)), f"{gb / median(samples):.3f}", ratio(put, median(samples))])
    first.notes += [f"state: {state_bytes / 2**20:.0f} MB in {state_files} files, one process; moto S3 server on localhost in its own process; {repeats} repeats, medians",
                    f"target: put / hasten >= 0.9; load average (1/5/15 min) at the end: {load}, "
                    f"{os.cpu_count()} CPUs"]
    third = Table("Sharded (DCP) state to s3://", ["side", "median", "GB/s", "ratio (put / side)"])
    put = median(direct["s3fs put of the same DCP folder on disk"])
    for name, samples in direct.items():
        third.rows.append([name, fmt_time(median(samples)), f"{dcp_bytes / 2**30 / median(samples):.3f}",
                           ratio(put, median(samples))])
    third.notes += [f"state: {dcp_bytes / 2**20:.0f} MB of DCP files, one process (DCP without a process group); "
                    f"the layer writes {remote_checkpoints.workers()} files at once, each a multipart upload",
                    f"target: put / hasten >= 0.9; load average (1/5/15 min): {load}"]
    second = Table("Training loop blocked by save_state(async_save=True)", ["side", "median blocked", "ratio (/ local)"])
    local = median(block["async to a local folder"])
    for name, samples in block.items():
        second.rows.append([name, fmt_time(median(samples)), ratio(median(samples), local)])
    second.notes += ["blocked = the call + what the next optimizer step waited for the staging copy; target: s3:// / "
                     "local <= 1.1", f"load average (1/5/15 min): {load}"]
    return [first, third, second]


def main(argv=None) -> int:
    parser = base_parser(__doc__.split("\n", 1)[0])
    parser.add_argument("--size-mb", type=int, default=None, help="model + AdamW state in MB (default 1024)")
    args = parser.parse_args(argv)
    size = args.size_mb or (8 if args.quick else 1024)
    repeats = args.repeats or (1 if args.quick else 3)
    return print_tables(run(size, repeats))


if __name__ == "__main__":
    sys.exit(main())
