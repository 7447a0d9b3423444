"""TPU (torch_xla) launching, Accelerate's entry points: one TPU host (`tpu_launcher`: `xmp.spawn` of the script's
main function), a pod (`tpu_pod_launcher`: the same `hasten launch --tpu` on every worker through gcloud, as
`hasten tpu-config` runs its commands), `prepare_tpu` (the XLA variables) and `install_xla` (Colab only)."""

from __future__ import annotations

import faulthandler
import importlib
import os
import shlex
import subprocess
import sys
import traceback
from pathlib import Path

from ..core.errors import ConfigError, LaunchError, NotSupportedYetError


def prepare_tpu(args, current_env: dict, pod: bool = False):
    """The XLA variables of a launch (bf16 on a TPU; debug mode); for a pod, Accelerate's renames of its args."""
    from ..core.availability import is_torch_xla_available

    if getattr(args, "mixed_precision", None) == "bf16" and is_torch_xla_available(check_is_tpu=True):
        current_env["XLA_DOWNCAST_BF16" if getattr(args, "downcast_bf16", False) else "XLA_USE_BF16"] = "1"
    if getattr(args, "debug", False):
        current_env["ACCELERATE_DEBUG_MODE"] = "true"
    if pod:
        args.vm = getattr(args, "tpu_vm", None)
        args.tpu = getattr(args, "tpu_name", None)
    return args, current_env


def install_xla(upgrade: bool = False):
    """Install torch_xla for the installed torch, on Google Colab only (as Accelerate)."""
    ipython = sys.modules.get("IPython")
    if ipython is None or "google.colab" not in str(ipython.get_ipython()):
        raise RuntimeError("`install_xla` utility works only on google colab.")
    import torch

    if upgrade:
        subprocess.run([sys.executable, "-m", "pip", "install", "-U", "torch"], check=True)
        torch_version = subprocess.check_output([sys.executable, "-c", "import torch; print(torch.__version__)"],
                                                text=True).strip()
    else:
        torch_version = torch.__version__
    release = torch_version.split("+")[0]
    subprocess.run([sys.executable, "-m", "pip", "install", f"torch_xla[tpu]=={release}"], check=True)


def _main_function(args):
    """The script's `--main_training_function`, imported as a module (a TPU launch calls a function)."""
    if getattr(args, "no_python", False):
        raise ConfigError("--no_python cannot be used with TPU launcher (it calls a function of a Python script)")
    if args.module:
        name = args.training_script
    else:
        path = Path(args.training_script)
        if not path.is_file():
            raise LaunchError(f"training script {args.training_script!r} does not exist")
        sys.path.append(str(path.parent.resolve()))
        name = path.stem
    module = importlib.import_module(name)
    function_name = getattr(args, "main_training_function", None) or "main"
    if not hasattr(module, function_name):
        raise ConfigError(
            f"Your training script should have a function named {function_name}, or you should pass a "
            "different value to `--main_training_function`."
        )
    sys.argv = [module.__file__, *args.training_script_args]
    return getattr(module, function_name)


def tpu_launcher(args):
    """Start `--num_processes` replicas of the script's main function on this host with `xmp.spawn` (None: one
    per device)."""
    try:
        xmp = importlib.import_module("torch_xla.distributed.xla_multiprocessing")
    except ImportError:
        raise LaunchError("hasten launch --tpu needs torch_xla: `pip install torch_xla` matching your torch "
                                   "(on a TPU VM: `pip install torch_xla[tpu]`)") from None
    args, current_env = prepare_tpu(args, {})
    main_function = _main_function(args)
    spawn(xmp, Replica(main_function), (), getattr(args, "num_processes", None), current_env)


class Replica:
    """`function` as xmp.spawn calls it, `(index, *args)`: marked fork-launched (the process group is not the
    replica's to destroy), then `function(*args)`. Accelerate's PrepareForLaunch does the same for XLA.

    A replica that fails prints its own traceback at once and releases the others from their wait: replicas may
    be threads of one process, where torch_xla reports the first error only after every thread has ended, and
    a thread still waiting in an XLA collective ends the process first (pjrt.spawn then says only "a process in
    the process pool was terminated abruptly", and the error was lost)."""

    def __init__(self, function):
        self.function = function

    def __call__(self, index: int, *args):
        os.environ["FORK_LAUNCHED"] = "1"
        try:
            return self.function(*args)
        except BaseException:
            from ..distributed import xla

            print(f"XLA replica {index} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            xla.abandon()
            raise


def spawn(xmp, launcher, args, replicas, env: dict, start_method: str = "spawn"):
    """`xmp.spawn` of `replicas` replicas. It takes 1 or "every device": on the CPU device the device count is
    CPU_NUM_DEVICES, set here to `replicas` unless the caller set it."""
    from .machine import patch_environment

    env = dict(env)
    if replicas and replicas > 1 and os.environ.get("PJRT_DEVICE", "").upper() == "CPU":
        env.setdefault("CPU_NUM_DEVICES", os.environ.get("CPU_NUM_DEVICES", str(replicas)))
    # A replica process that dies of a signal (a crash in native code) prints every thread's Python stack first,
    # where pjrt.spawn alone says only that a process "was terminated abruptly": spawned processes through
    # PYTHONFAULTHANDLER, forked ones by inheriting this process's handler (on the real stderr: a notebook's
    # sys.stderr has no file descriptor).
    env.setdefault("PYTHONFAULTHANDLER", os.environ.get("PYTHONFAULTHANDLER", "1"))
    was_enabled = faulthandler.is_enabled()
    if sys.__stderr__ is not None:
        faulthandler.enable(file=sys.__stderr__, all_threads=True)
    try:
        with patch_environment(**env):
            return xmp.spawn(launcher, args=args, nprocs=1 if replicas == 1 else None, start_method=start_method)
    finally:
        if not was_enabled:
            faulthandler.disable()


def tpu_pod_command(args, current_env: dict) -> list:
    """The gcloud command that runs `hasten launch --tpu` with this launch's script on every worker of the pod."""
    name, zone = getattr(args, "tpu_name", None), getattr(args, "tpu_zone", None)
    if not name or not zone:
        raise ConfigError("a TPU pod launch (--tpu_cluster) needs the pod's name and zone: set tpu_name and tpu_zone "
                          "in the config file (`hasten config`)")
    variables = {**current_env, "ACCELERATE_IN_TPU_POD": "1"}
    tpu_env = getattr(args, "tpu_env", None) or []
    for item in [*(tpu_env if isinstance(tpu_env, list) else [tpu_env]), *(getattr(args, "env", None) or [])]:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--env {item!r} is not KEY=VALUE")
        variables[key] = value
    launch = [*(["sudo"] if getattr(args, "tpu_use_sudo", False) else []), "env",
              *(f"{key}={value}" for key, value in variables.items()),
              "hasten", "launch", "--tpu", "--no_tpu_cluster", "--num_machines", "1", "--mixed_precision", "no",
              "--dynamo_backend", "no",
              *(["--num_processes", str(args.num_processes)] if args.num_processes is not None else []),
              "--main_training_function", str(getattr(args, "main_training_function", None) or "main"),
              *(["-m"] if args.module else []), args.training_script, *args.training_script_args]
    remote = f"cd {shlex.quote(os.getcwd())}; " + shlex.join(launch)
    return ["gcloud", "compute", "tpus", "tpu-vm", "ssh", name, "--zone", zone, "--command", remote, "--worker", "all"]


def tpu_pod_launcher(args):
    """Run the launch on every worker of a TPU pod (Accelerate: `accelerate-launch --tpu --no_tpu_cluster ...`
    through torch_xla's xla_dist, which torch_xla 2.x no longer has; hasten goes through gcloud)."""
    args, current_env = prepare_tpu(args, {}, pod=True)
    command = tpu_pod_command(args, current_env)
    try:
        subprocess.run(command, check=True)
    except FileNotFoundError:
        raise ConfigError("gcloud is not installed or not on PATH; fix: install the Google Cloud CLI "
                          "(https://cloud.google.com/sdk/docs/install)") from None


_ARGS_FROM_SETTINGS = ("num_processes", "mixed_precision", "downcast_bf16", "debug", "main_training_function",
                       "tpu_use_sudo", "env", "tpu_env", "tpu_name", "tpu_zone")


def _config_file_keys(path: str) -> dict:
    from ..config import file as config_file

    return config_file.validate(config_file.read_raw(path), path, fill_defaults=False, refuse_unbuilt=False)


def launch(args, plan) -> int:
    """`hasten launch --tpu`: the resolved settings onto `args` (as Accelerate's launcher reads them), then one
    host or the pod."""
    file_values = None
    for name in _ARGS_FROM_SETTINGS:
        try:
            setattr(args, name, plan.settings[name])
            if name == "num_processes" and plan.settings.values[name].source == "default":
                # Not given anywhere: every device of the host, as Accelerate's `xmp.spawn` without `nprocs`
                # (the default 1 would train on one core of eight). A given count, 1 included, is honoured.
                args.num_processes = None
        except KeyError:  # tpu_name/tpu_zone: keys of the config file that `hasten tpu-config` reads too
            if file_values is None:
                path = getattr(plan.settings, "config_path", None)
                file_values = _config_file_keys(path) if path else {}
            setattr(args, name, file_values.get(name))
    os.environ.update(plan.env)
    if plan.settings["tpu_use_cluster"] and not plan.settings["no_tpu_cluster"]:
        tpu_pod_launcher(args)
    else:
        tpu_launcher(args)
    return 0


SAGEMAKER_NOT_BUILT = ("hasten does not start Amazon SageMaker jobs; run `hasten launch` inside the SageMaker container, "
                       "or start the job with Accelerate")


def sagemaker_launcher(sagemaker_config, args):
    """Accelerate's launcher that starts a SageMaker training job: refused, with the reason."""
    raise NotSupportedYetError(f"sagemaker_launcher: {SAGEMAKER_NOT_BUILT}")


def prepare_sagemager_args_inputs(sagemaker_config, args):
    """Accelerate's helper (its spelling) that builds a SageMaker estimator's arguments: refused, with the reason."""
    raise NotSupportedYetError(f"prepare_sagemager_args_inputs: {SAGEMAKER_NOT_BUILT}")
