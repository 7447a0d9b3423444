"""Accelerate's launch helpers (`accelerate.utils.launch`): the command and environment a launch would use.

They resolve a parsed `hasten launch` command line exactly as `hasten launch` does (`launch.plan.plan_launch`:
flags, then environment, then config file), so what they return is what the launcher runs.
"""

from __future__ import annotations

import os
import subprocess  # noqa: F401 - Accelerate patches utils.launch.subprocess.check_output (the module object mpirun uses)
from shutil import which

from ..core.enums import DistributedType
from ..core.errors import ConfigError
from ..core.env import parse_int
from . import mpirun

# distributed types whose processes find their rank from LOCAL_RANK/RANK
_RANKED_TYPES = (
    DistributedType.MULTI_GPU, DistributedType.MULTI_MLU, DistributedType.MULTI_MUSA, DistributedType.MULTI_NPU,
    DistributedType.MULTI_XPU, DistributedType.MULTI_CPU, DistributedType.MULTI_NEURON,
)


def _plan(args):
    from .plan import _with_launch_defaults, plan_launch

    args = _with_launch_defaults(args)
    if getattr(args, "no_python", False) and getattr(args, "module", False):
        raise ConfigError("--module and --no_python cannot be used together; pass one of them")
    return plan_launch(args)


def _get_mpirun_args() -> tuple:
    """(program, hostfile option, process-count option, processes-per-machine option, bind option) of the MPI on
    PATH; `which` is looked up here, where Accelerate's `utils.launch.which` is."""
    return mpirun.get_mpirun_args(which)


def prepare_simple_launcher_cmd_env(args) -> tuple:
    """(command, environment) to run the script as one process: `[python, script, *script_args]` and a copy of
    `os.environ` with the run's settings added (the `HASTEN_*` variables `hasten launch` exports).

    With an mpirun hostfile (`--mpirun_hostfile`, or `mpirun_config.mpirun_hostfile` in the file) the command
    starts with `mpirun -f HOSTFILE -ppn N -n TOTAL` (Open MPI: `--hostfile ... --npernode ... --bind-to socket`)
    and the environment names the main process (MASTER_ADDR, MASTER_PORT)."""
    from .plan import _script_command

    plan = _plan(args)
    prefix = mpirun.mpirun_prefix(plan, which)
    env = {**os.environ, **plan.env, **(mpirun.mpirun_env(plan) if prefix else {})}
    return prefix + _script_command(args), env


def prepare_multi_gpu_env(args) -> dict:
    """The environment for a torchrun launch of `args`, a copy of `os.environ` with the run's settings added.

    As in Accelerate, torchrun's own options are also set on `args` (`nproc_per_node`, `nnodes`, `node_rank`,
    `master_addr`, `master_port`, `rdzv_backend`, `rdzv_endpoint`, `rdzv_conf`, `max_restarts`,
    `monitor_interval`), so `torch.distributed.run.run(args)` can start the processes. The port is chosen as
    `hasten launch` chooses it (as Accelerate does): the given one, else 29500; `main_process_port=0` takes a free
    one; a port already in use on a single machine is a warning and a free port, on several machines a
    `ConnectionError`.
    """
    from .plan import _resolve_port

    plan = _plan(args)
    port = _resolve_port(plan)  # as `hasten launch`: 29500 by default, 0 picks a free port
    args.nproc_per_node = str(plan.nproc_per_node)
    args.nnodes = str(plan.num_machines)
    args.node_rank = plan.machine_rank
    args.master_addr = plan.main_process_ip
    args.master_port = str(port)
    args.rdzv_backend = plan.rdzv_backend
    args.rdzv_endpoint = f"{plan.main_process_ip}:{port}" if plan.rdzv_backend != "static" or plan.num_machines > 1 else ""
    args.rdzv_conf = ",".join(f"{k}={v}" for k, v in plan.rdzv_conf.items())
    args.max_restarts = plan.max_restarts
    args.monitor_interval = plan.monitor_interval
    return {**os.environ, **plan.env}


def _export_rows(args, prefix: str, current_env: dict) -> dict:
    """Write each `args.<row>` that is set for the table rows named `prefix*` under the variable the training
    processes read (the row's export); a row hasten has not built is refused in one line when set."""
    from ..config import settings as table
    from ..config.resolve import _text

    for row in table.SETTINGS:
        if not row.name.startswith(prefix) or not row.flags:
            continue
        value = getattr(args, row.flag_dest, None)
        if value is None or value is False:
            continue
        row.refuse(f"--{row.flag_dest}", value)
        if not row.built or row.export is None:
            continue
        if row.name == "fp8_override_linear_precision":
            for part, flag in zip(("fprop", "dgrad", "wgrad"), value):
                current_env[table.get(f"fp8_override_{part}").export] = _text(flag)
        else:
            current_env[row.export] = _text(value)
    return current_env


def setup_fp8_env(args, current_env: dict) -> dict:
    """Add the FP8 settings of a parsed launch command line (`--fp8_*`) to `current_env`, under the variables
    the training processes read (`HASTEN_FP8_*`; the three overrides of `fp8_override_linear_precision` each
    get their own). Returns `current_env`."""
    return _export_rows(args, "fp8_", current_env)


def prepare_extend_env_parallelism_config(args, current_env: dict) -> dict:
    """Turn on the parallelism config for the run and add its sizes and options from a parsed launch command
    line (`--parallelism_config_*`) to `current_env` (`PARALLELISM_CONFIG_*`). Returns `current_env`."""
    from ..config import settings as table

    current_env[table.get("use_parallelism_config").export] = "true"
    return _export_rows(args, "parallelism_config_", current_env)


def env_var_path_add(env_var_name: str, path_to_add: str) -> str:
    """`os.environ[env_var_name]` (a `:`-separated list of paths) with `path_to_add` appended; the result is
    returned, the environment is not changed."""
    paths = [p for p in os.environ.get(env_var_name, "").split(":") if p]
    paths.append(str(path_to_add))
    return ":".join(paths)


class PrepareForLaunch:
    """`launcher` made ready to be started as process number `index` of a forked group.

    Called as `(index, *args)`. With `debug=True` it joins a gloo group through the file named by
    `ACCELERATE_DEBUG_RDV_FILE` (or `HASTEN_DEBUG_RDV_FILE`), `WORLD_SIZE` processes in all; for the
    multi-device distributed types it sets `LOCAL_RANK=index` and `RANK=NPROC*NODE_RANK+index`. It always
    sets `FORK_LAUNCHED=1`, then calls `launcher(*args)`.
    """

    def __init__(self, launcher, distributed_type="NO", debug: bool = False):
        self.launcher = launcher
        self.distributed_type = DistributedType(distributed_type)
        self.debug = debug

    def __call__(self, index: int, *args):
        if self.debug:
            import torch.distributed as dist

            store_file = os.environ.get("HASTEN_DEBUG_RDV_FILE") or os.environ.get("ACCELERATE_DEBUG_RDV_FILE")
            if not store_file or "WORLD_SIZE" not in os.environ:
                raise ConfigError("PrepareForLaunch(debug=True) needs WORLD_SIZE and ACCELERATE_DEBUG_RDV_FILE "
                                  "(a file path every process can reach) in the environment")
            world_size = parse_int(os.environ["WORLD_SIZE"], minimum=1)
            dist.init_process_group("gloo", rank=index, world_size=world_size,
                                    store=dist.FileStore(store_file, world_size))
        elif self.distributed_type in _RANKED_TYPES:
            nproc = parse_int(os.environ.get("NPROC", 1), minimum=1)
            node_rank = parse_int(os.environ.get("NODE_RANK", 0), minimum=0)
            os.environ["LOCAL_RANK"] = str(index)
            os.environ["RANK"] = str(nproc * node_rank + index)
        os.environ["FORK_LAUNCHED"] = "1"
        return self.launcher(*args)


_SAGEMAKER_FLAG_ONLY = (
    "SageMaker doesn’t support argparse actions for `store_true` or `store_false`. Please define explicit types"
)


def _script_value(text: str):
    """A script argument's value as SageMaker's hyperparameters want it: True/False as bools, whole numbers as
    ints ("3", "3.0"), other numbers as floats ("5e-5", "50.5"), anything else as the text itself."""
    if text in ("True", "False"):
        return text == "True"
    try:
        number = float(text)
    except ValueError:
        return text
    return int(number) if number.is_integer() else number


def _convert_nargs_to_dict(nargs: list) -> dict:
    """The training script's `--name value` arguments as a dict for SageMaker's hyperparameters.

    Each `--name` (or `-name`) must be followed by one value; the key is the name without dashes, with `-`
    read as `_` (as argparse names its destinations); a negative number is a value. A flag with no value (a `store_true` switch) is a ValueError:
    SageMaker passes every hyperparameter as `--name value`.
    """
    result = {}
    index = 0
    while index < len(nargs):
        item = nargs[index]
        if not item.startswith("-"):
            raise ValueError(f"training script argument {item!r} follows no --name; SageMaker hyperparameters are "
                             "passed as `--name value` pairs")
        following = nargs[index + 1] if index + 1 < len(nargs) else None
        if following is None or (following.startswith("-") and isinstance(_script_value(following), str)):
            raise ValueError(f"{_SAGEMAKER_FLAG_ONLY} ({item} has no value; fix: pass it as `{item} True`)")
        result[item.lstrip("-").replace("-", "_")] = _script_value(following)
        index += 2
    return result


def prepare_deepspeed_cmd_env(args):
    """Accelerate builds a `deepspeed`/pdsh command for multi-node DeepSpeed here. hasten launches DeepSpeed
    through torchrun like every other backend, so DeepSpeed's own hostfile launchers are refused in one line."""
    from ..core.errors import NotSupportedYetError

    raise NotSupportedYetError(
        "prepare_deepspeed_cmd_env: DeepSpeed's own multi-node launchers (pdsh, hostfile) are not built in hasten; "
        "launch every machine with `hasten launch --use_deepspeed --num_machines N --machine_rank I "
        "--main_process_ip HOST ...` (torchrun) instead"
    )


from .tpu import prepare_sagemager_args_inputs, prepare_tpu  # noqa: E402,F401 - Accelerate names them on its utils.launch path (this module)
