"""Accelerate's `utils.tqdm` path; the code lives in `hasten.progress`."""

from ..progress import tqdm  # noqa: F401
