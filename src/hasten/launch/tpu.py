"""TPU (torch_xla) entry points Accelerate has. hasten has no XLA backend, so each of them refuses in one line
instead of half-working. (`hasten tpu-config`, which only runs setup commands on a pod through gcloud, is built.)"""

from __future__ import annotations

from ..core.errors import NotSupportedYetError

NOT_BUILT = "TPUs are not supported by hasten (it has no torch_xla backend); use Accelerate for TPU training"


def prepare_tpu(args, current_env: dict, pod: bool = False):
    """Accelerate's launcher step that sets the XLA environment variables: refused, with the reason."""
    raise NotSupportedYetError(f"prepare_tpu: {NOT_BUILT}")


def install_xla(upgrade: bool = False):
    """Accelerate's Colab helper that pip-installs torch_xla: refused, with the reason (hasten would not use it)."""
    raise NotSupportedYetError(f"install_xla: {NOT_BUILT}")


def tpu_launcher(args):
    """Accelerate's launcher for one TPU host: refused, with the reason."""
    raise NotSupportedYetError(f"tpu_launcher: {NOT_BUILT}")


def tpu_pod_launcher(args):
    """Accelerate's launcher for a TPU pod: refused, with the reason."""
    raise NotSupportedYetError(f"tpu_pod_launcher: {NOT_BUILT}")


SAGEMAKER_NOT_BUILT = ("hasten does not start Amazon SageMaker jobs; run `hasten launch` inside the SageMaker container, "
                       "or start the job with Accelerate")


def sagemaker_launcher(sagemaker_config, args):
    """Accelerate's launcher that starts a SageMaker training job: refused, with the reason."""
    raise NotSupportedYetError(f"sagemaker_launcher: {SAGEMAKER_NOT_BUILT}")


def prepare_sagemager_args_inputs(sagemaker_config, args):
    """Accelerate's helper (its spelling) that builds a SageMaker estimator's arguments: refused, with the reason."""
    raise NotSupportedYetError(f"prepare_sagemager_args_inputs: {SAGEMAKER_NOT_BUILT}")
