"""The questions checkpoint code outside the storage layer may ask of a local checkpoint folder.

Every read and write of checkpoint bytes goes through this package (`durable`, `fast_io`, `marker`, `folder`,
`dcp`, `local`, `remote`); the layout code, the backends' checkpoint code and resume discovery ask what is there
through these few functions instead of `os`, so that one package holds every place a checkpoint touches a
filesystem (`tests/checkpoint/test_storage_layer.py` checks that no other module does).
"""

from __future__ import annotations

import os


def is_file(path: str) -> bool:
    return os.path.isfile(path)


def is_dir(path: str) -> bool:
    return os.path.isdir(path)


def exists(path: str) -> bool:
    return os.path.exists(path)


def names_in(folder: str) -> list:
    """The names directly in `folder`, sorted; [] when it is not a folder."""
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def files_in(folder: str) -> list:
    """The names of the plain files directly in `folder`, sorted."""
    return [name for name in names_in(folder) if os.path.isfile(os.path.join(folder, name))]


def make_folder(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    return path


def remove_file(path: str) -> None:
    """Remove the file `path`; nothing when it is not there."""
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def write_text(path: str, text: str) -> None:
    """A small text file (an index, a README beside saved weights), written plainly (not part of a commit)."""
    with open(path, "w") as handle:
        handle.write(text)
