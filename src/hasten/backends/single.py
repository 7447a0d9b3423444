"""One process: place the model on the device, nothing more."""

from .base import Backend


class SingleBackend(Backend):
    name = "single"
