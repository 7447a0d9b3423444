"""Accelerate's `utils.random` path; the code lives in `hasten.distributed.rng`."""

from ..distributed.rng import set_seed, synchronize_rng_state, synchronize_rng_states  # noqa: F401
