"""Every error hasten raises on purpose. Each subclasses what Accelerate raised, so `except` keeps working."""


class HastenError(Exception):
    """Base class of hasten's own errors."""


class ConfigError(HastenError, ValueError):
    """A configuration value (argument, flag, environment variable, file key) is wrong."""


class LaunchError(HastenError, RuntimeError):
    """`hasten launch` could not start the processes, or one of them failed."""


class PortInUseError(LaunchError, ConnectionError):
    """The rendezvous port is taken (a ConnectionError, as Accelerate's launcher raises there)."""


class DistributedOperationException(HastenError, RuntimeError):
    """A collective was called with inputs that differ across ranks (found in debug mode)."""


class ProcessLeftError(DistributedOperationException):
    """A process of a `notebook_launcher` / `debug_launcher` run ended its function instead of joining the group."""


class HangDetectedError(DistributedOperationException):
    """Debug mode's hang doctor stopped the run: ranks called different collectives, a rank left before a
    collective the others wait in, or a collective outlived its timeout. The full report is `.hasten_report`."""


class StateResetError(HastenError, AttributeError):
    """A shared state was reset and not created again."""


class NotSupportedYetError(HastenError, NotImplementedError):
    """An Accelerate feature hasten does not implement yet."""


class CheckpointError(HastenError, RuntimeError):
    """A checkpoint is missing, incomplete, corrupt or unsafe to load."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file would execute code when loaded and the user did not opt in."""


class ChecksumError(CheckpointError):
    """A checkpoint file's bytes differ from the checksums its completeness marker recorded when it was written."""


class DiskFullError(CheckpointError):
    """A save ran out of disk space (ENOSPC); the checkpoint it wrote was removed, the previous one is intact."""


class TrackerError(HastenError, RuntimeError):
    """An experiment tracker failed while logging, and `HASTEN_TRACKER_ERRORS=raise` asked to stop."""


class NotBuiltError(ConfigError, NotSupportedYetError):
    """A setting (or one value of it) that hasten knows by name but has not built yet: refused, never ignored."""


class DeviceMapError(HastenError, ValueError):
    """A device map, a memory budget or a big-model loading argument is wrong."""


class OffloadError(HastenError, ValueError):
    """Offloaded weights cannot be written or found (no offload folder, a missing index, a bad file)."""


class PipelineSplitError(ConfigError):
    """A model cannot be cut into pipeline stages as asked (not a sequence of blocks, a bad split list, too few
    blocks for the stages)."""


class PipelineCallError(HastenError, ValueError):
    """A pipelined model was called in a way its schedule cannot run (no labels, a batch the micro-batches do not
    divide, arguments a stage cannot receive)."""


class MegatronLMOnlyError(NotSupportedYetError):
    """An object that exists only inside the Megatron-LM library (its engine, train steps, data loader, model
    providers); hasten serves Megatron-LM's settings natively and names the native equivalent."""


class HubAccessError(ConfigError, OSError):
    """Something needs the Hugging Face Hub, which hasten never contacts (estimate-memory reads local folders).
    An OSError too, as Accelerate's estimate raises for a repo it cannot reach."""


def _launched_function_error():
    """`LaunchedFunctionError`: a process started by `notebook_launcher` / `debug_launcher` failed. A `LaunchError`
    whose text is hasten's one line, and torch's `ChildFailedError` (`.name`, `.failures`), which Accelerate's
    launchers raise and scripts catch (Accelerate's own test_notebook.py does). Built on first use: importing
    torch's elastic package costs about half a second, which `import hasten` must not pay."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    class LaunchedFunctionError(LaunchError, ChildFailedError):
        __module__ = __name__

        def __init__(self, message: str, name: str = "", failures: dict | None = None):
            self.name = name
            self.failures = dict(failures or {})
            Exception.__init__(self, message)

        def __str__(self) -> str:
            return str(self.args[0]) if self.args else ""

    return LaunchedFunctionError


def __getattr__(name):
    if name == "LaunchedFunctionError":
        value = globals()[name] = _launched_function_error()
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
