"""Checkpoint bytes reach a filesystem only through the storage layer (`hasten/checkpoint/storage/`).

The checkpoint code (`hasten/checkpoint/`, `checkpointing.py`) and every backend's checkpoint code ask what is in a
folder through `storage.paths`, write and read files through `durable`/`fast_io`, and hand torch.distributed.checkpoint
a reader or writer from `storage.dcp`; none of them calls `open`, `os`'s file functions, `shutil`, `torch.save`/
`torch.load` on a path, or DCP with a bare path. A new place that did would be invisible to the layer: it would skip
the checksums, the commit and every store the layer knows.
"""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch

import hasten
from hasten.checkpoint.storage import into_store
from source_rules import dotted

PACKAGE = pathlib.Path(hasten.__file__).parent
LAYER = PACKAGE / "checkpoint" / "storage"

_OS_FILE_CALLS = {"open", "replace", "rename", "remove", "unlink", "makedirs", "mkdir", "rmdir", "listdir", "scandir",
                  "walk", "stat", "fsync", "statvfs"}
_OS_PATH_QUERIES = {"exists", "isfile", "isdir", "islink", "getsize", "getmtime", "lexists"}
_LIBRARY_FILE_CALLS = {("torch", "save"), ("torch", "load"), ("dcp", "save"), ("dcp", "load"), ("dcp", "async_save"),
                       ("safetensors", "save_file"), ("safetensors", "load_file")}
# (module, function): a file access that is not a checkpoint's
_NOT_CHECKPOINTS = {("backends/deepspeed/backend.py", "_op_is_built")}  # a compiled extension in torch's build cache


def _modules():
    checkpoint = [p for p in (PACKAGE / "checkpoint").rglob("*.py") if LAYER not in p.parents]
    return [*checkpoint, PACKAGE / "checkpointing.py", *(PACKAGE / "backends").rglob("*.py")]



def _file_access(call: ast.Call) -> str | None:
    name = dotted(call.func)
    parts = name.split(".")
    if name == "open":
        return name
    if parts[0] == "os" and len(parts) == 2 and parts[1] in _OS_FILE_CALLS:
        return name
    if parts[:2] == ["os", "path"] and len(parts) == 3 and parts[2] in _OS_PATH_QUERIES:
        return name
    if parts[0] == "shutil":
        return name
    if len(parts) >= 2 and (parts[0], parts[-1]) in _LIBRARY_FILE_CALLS:
        return name
    if name in ("save_file", "load_file", "safe_open"):
        return name
    return None


def _violations(path: pathlib.Path, package: pathlib.Path = PACKAGE) -> list:
    relative = path.relative_to(package).as_posix()
    tree = ast.parse(path.read_text())
    found = []

    def visit(node, function: str):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call):
                access = _file_access(child)
                if access and (relative, function) not in _NOT_CHECKPOINTS:
                    found.append(f"{relative}:{child.lineno} {access}() in {function or 'the module'}")
            visit(child, inner)

    visit(tree, "")
    return found


def test_no_checkpoint_code_outside_the_storage_layer_touches_a_filesystem():
    modules = _modules()
    assert len(modules) > 30  # the checkpoint package, checkpointing.py and every backend
    found = [line for path in modules for line in _violations(path)]
    assert not found, "file access outside hasten/checkpoint/storage/:\n" + "\n".join(found)


def test_the_rule_sees_each_kind_of_access(tmp_path):
    """The rule itself: each kind of call it forbids is found, and a path joined or split is not a file access."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os, shutil, torch\n"
        "import torch.distributed.checkpoint as dcp\n"
        "def f(p, s):\n"
        "    open(p)\n"
        "    os.listdir(p)\n"
        "    os.path.isfile(p)\n"
        "    shutil.rmtree(p)\n"
        "    torch.save(s, p)\n"
        "    dcp.save(s, checkpoint_id=p)\n"
        "    os.path.join(p, 'x')\n"
        "    os.path.dirname(p)\n"
    )
    found = _violations(sample, package=tmp_path)
    assert [line.split()[1] for line in found] == ["open()", "os.listdir()", "os.path.isfile()", "shutil.rmtree()",
                                                   "torch.save()", "dcp.save()"]


# -- DCP folders read where they are stored ----------------------------------------------------------------------
@pytest.fixture
def store(tmp_path, monkeypatch):
    """A memory:// storage with 4 KiB checksum chunks (so that one tensor spans several); its objects, and any DCP
    folder registered as read from it, go at the end."""
    import fsspec

    from hasten.checkpoint.storage import checksum, storage_for
    from hasten.checkpoint.storage import dcp as layer_dcp

    monkeypatch.setattr(checksum, "CHUNK_BYTES", 4096)
    root = f"memory://hasten-layer-{tmp_path.name}"
    yield storage_for(root)
    layer_dcp.stop_streaming_under(str(tmp_path))
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


def _state():
    torch.manual_seed(0)
    return {"model": {"weight": torch.randn(64, 64), "bias": torch.randn(64)}}


@pytest.fixture
def stored(store, tmp_path):
    """A DCP folder written by the layer, copied into `store` under "ckpt" with the checksums a commit takes:
    (state, local folder, storage, name, {file: (size, spec)})."""
    from hasten.checkpoint.storage import checksum
    from hasten.checkpoint.storage import dcp as layer_dcp

    state = _state()
    local = tmp_path / "pytorch_model_fsdp_0"
    layer_dcp.save(state, str(local))
    files = {}
    for path in sorted(local.iterdir()):
        store.write(f"ckpt/{path.name}", path.read_bytes())
        files[path.name] = (path.stat().st_size, checksum.digest_file(str(path)))
    return state, str(local), store, "ckpt", files


def _fresh(state):
    return {"model": {key: torch.zeros_like(value) for key, value in state["model"].items()}}


def test_a_dcp_folder_in_the_store_is_read_there_chunk_by_chunk(stored, monkeypatch):
    from hasten.checkpoint.storage import dcp as layer_dcp

    state, local, storage, name, files = stored
    for path in pathlib.Path(local).iterdir():  # nothing is read from the local disk
        path.unlink()
    requests = []
    read = storage.read
    monkeypatch.setattr(storage, "read", lambda *a, **k: requests.append(a) or read(*a, **k))
    layer_dcp.stream_from(local, storage, name, files)
    loaded = _fresh(state)
    layer_dcp.load(loaded, local)
    assert all(torch.equal(loaded["model"][k], v) for k, v in state["model"].items())
    shard = [n for n in files if n.endswith(".distcp")][0]
    # ranged requests of at most one chunk each, every chunk of the shard once
    assert sorted(a[1] for a in requests if a[0].endswith(shard)) == list(range(0, files[shard][0], 4096))
    assert all(a[2] <= 4096 for a in requests)


@pytest.mark.parametrize("damage", ["flipped", "truncated"])
def test_a_damaged_dcp_object_in_the_store_is_refused_naming_it(damage, stored):
    from hasten.checkpoint.storage import dcp as layer_dcp
    from hasten.core.errors import ChecksumError

    state, local, storage, name, files = stored
    shard = [n for n in files if n.endswith(".distcp")][0]
    data = bytearray(storage.read(f"{name}/{shard}"))
    if damage == "flipped":
        data[5000] ^= 0x10  # inside the weight, in its second chunk
    else:
        del data[-100:]
    storage.write(f"{name}/{shard}", bytes(data))
    layer_dcp.stream_from(local, storage, name, files)
    with pytest.raises(ChecksumError, match=f"{name}/{shard}.*(corrupt|truncated)"):
        layer_dcp.load(_fresh(state), local)


def test_a_dcp_folder_is_written_straight_into_the_store_and_read_back_from_it(store, tmp_path):
    from hasten.checkpoint.storage import checksum
    from hasten.checkpoint.storage import dcp as layer_dcp

    state = _state()
    save_folder = tmp_path / "save"
    into_store.write_into(str(save_folder), store, "ckpt/.v-1", threads=2)
    try:
        layer_dcp.save(state, str(save_folder / "pytorch_model_fsdp_0"))
    finally:
        written = into_store.stop_writing_into(str(save_folder))
    # nothing of it on the local disk: an empty folder for the save's bookkeeping
    assert list((save_folder / "pytorch_model_fsdp_0").iterdir()) == []
    in_store = store.listdir("ckpt/.v-1/pytorch_model_fsdp_0")
    assert sorted(f"pytorch_model_fsdp_0/{n}" for n in in_store) == sorted(written)
    assert ".metadata" in in_store and not any(n.endswith(".tmp") for n in in_store)
    for name, (size, spec) in written.items():  # sizes and checksums taken on the way out match the store
        data = store.read(f"ckpt/.v-1/{name}")
        assert len(data) == size
        assert spec["digests"] == [checksum.digest([data[i:i + 4096]], spec["algorithm"])
                                   for i in range(0, len(data), 4096)]
    files = {name.split("/", 1)[1]: entry for name, entry in written.items()}
    local = tmp_path / "loaded" / "pytorch_model_fsdp_0"
    layer_dcp.stream_from(str(local), store, "ckpt/.v-1/pytorch_model_fsdp_0", files)
    loaded = _fresh(state)
    layer_dcp.load(loaded, str(local))
    assert all(torch.equal(loaded["model"][k], v) for k, v in state["model"].items())


def test_a_failed_upload_stream_is_abandoned_and_nothing_is_reported_written(store, tmp_path, monkeypatch):
    from hasten.checkpoint.storage import dcp as layer_dcp
    from hasten.core.errors import CheckpointError

    abandoned = []

    class Failing:
        def __init__(self, name):
            self.name, self.count = name, 0

        def write(self, data):
            self.count += len(data)
            if self.count > 1000:
                raise ConnectionResetError("the store dropped the connection")

        def discard(self):
            abandoned.append(self.name)

        def close(self):
            raise AssertionError("a failed upload must not be completed")

    monkeypatch.setattr(store, "open_writer", lambda name: Failing(name))
    into_store.write_into(str(tmp_path / "save"), store, "ckpt/.v-1")
    try:
        with pytest.raises(CheckpointError, match=r"upload of memory://.*/ckpt/\.v-1/pytorch_model_fsdp_0/__0_0\.distcp "
                                                  r"failed: ConnectionResetError: the store dropped the connection"):
            layer_dcp.save({"w": torch.randn(64, 64)}, str(tmp_path / "save" / "pytorch_model_fsdp_0"))
    finally:
        written = into_store.stop_writing_into(str(tmp_path / "save"))
    assert written == {} and len(abandoned) == 1 and abandoned[0].endswith(".distcp")
