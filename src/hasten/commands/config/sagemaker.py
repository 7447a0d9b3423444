"""Accelerate's `commands.config.sagemaker` (the questions `accelerate config` asks for Amazon SageMaker).
hasten does not run SageMaker jobs, so its entry point refuses in one line; `hasten config` writes
LOCAL_MACHINE configs."""

from __future__ import annotations

from ...core.errors import NotSupportedYetError

NOT_BUILT = ("Amazon SageMaker is not supported by hasten (it launches no SageMaker jobs); write a LOCAL_MACHINE "
             "config with `hasten config`, or use Accelerate for SageMaker")


def get_sagemaker_input():
    """Refused: SageMaker is not built in hasten."""
    raise NotSupportedYetError(NOT_BUILT)
