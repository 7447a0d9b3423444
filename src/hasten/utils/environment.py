"""Accelerate's `utils.environment` path; the code lives in `hasten.environment`."""

from ..environment import (  # noqa: F401
    get_int_from_env,
    parse_choice_from_env,
    parse_flag_from_env,
    str_to_bool,
)
