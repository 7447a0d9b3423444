"""Trackio: a local SQLite database per project (under `TRACKIO_DIR`, default
`~/.cache/huggingface/trackio`); view it with `trackio show --project <name>`."""

from __future__ import annotations

from .base import ProjectRunTracker


class TrackioTracker(ProjectRunTracker):
    name = "trackio"
