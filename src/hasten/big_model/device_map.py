"""Device maps: how big each module is, how much memory each device offers, and where each module goes.

`infer_auto_device_map` and `get_balanced_memory` give the same maps as Accelerate 1.15 (tests hold a table
of them), so a model dispatched by either library is split the same way. The allocation rule, in short:
devices are filled in order (GPUs by index, then CPU, then disk); the first GPU and the CPU keep room for the
largest layer (a CPU- or disk-offloaded layer is brought there to run); a module that does not fit is split
into its direct parameters and children unless its class is in `no_split_module_classes`; tied parameters
pull their modules onto the same device.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import re
import warnings
from collections import OrderedDict, defaultdict

import torch
from torch import nn

from ..core.errors import DeviceMapError

logger = logging.getLogger(__name__)

_NON_CASTING_PREFIXES = ("torch.uint", "torch.int", "torch.bool")


# -- sizes -----------------------------------------------------------------------------------------------------
def convert_file_size_to_int(size):
    """Bytes in `size`: an int, or a string such as "5GB" (10**9), "5GiB" (2**30), "40Mb" (megabits)."""
    if isinstance(size, int) and not isinstance(size, bool):
        if size < 0:
            raise DeviceMapError(f"memory size {size} is negative; give a number of bytes >= 0 or a string like '5GB'")
        return size
    units = (("GIB", 2**30), ("MIB", 2**20), ("KIB", 2**10), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3))
    if isinstance(size, str):
        for unit, factor in units:
            if size.upper().endswith(unit):
                try:
                    value = int(float(size[: -len(unit)]) * factor)
                except ValueError:
                    break
                if unit in ("GB", "MB", "KB") and size.endswith("b"):
                    value //= 8  # a lower-case b means bits
                if value >= 0:
                    return value
                break
    raise DeviceMapError(f"size {size!r} is not a valid size; use an integer number of bytes or a string like '5GB' "
                         "or '500MiB'")


def dtype_byte_size(dtype):
    """Bytes taken by one element of `dtype` (1/8 for bool; 1 for float8 types)."""
    from ..core.enums import CustomDtype

    if dtype == torch.bool:
        return 1 / 8
    if dtype == CustomDtype.INT2:
        return 1 / 4
    if dtype == CustomDtype.INT4:
        return 1 / 2
    if dtype == CustomDtype.FP8 or str(dtype).startswith("torch.float8_"):
        return 1
    found = re.search(r"[^\d](\d+)$", str(dtype))
    if found is None:
        raise DeviceMapError(f"`dtype` {dtype} is not a valid dtype")
    return int(found.group(1)) // 8


def _as_dtype(dtype):
    if isinstance(dtype, str):
        name = dtype.replace("torch.", "")
        resolved = getattr(torch, name, None)
        if not isinstance(resolved, torch.dtype):
            raise DeviceMapError(f"dtype {dtype!r} is not a torch dtype; use e.g. 'float16' or torch.float16")
        return resolved
    return dtype


def compute_module_sizes(model, dtype=None, special_dtypes=None, buffers_only: bool = False):
    """Bytes of every module and tensor name prefix ("" is the whole model), counted at `dtype` if given
    (floating tensors only shrink to it; integer and bool tensors keep their size)."""
    dtype_size = dtype_byte_size(_as_dtype(dtype)) if dtype is not None else None
    special = {k: dtype_byte_size(_as_dtype(v)) for k, v in (special_dtypes or {}).items()}
    sizes = defaultdict(int)
    # Parameters then buffers (modeling.named_module_tensors' order), without importing modeling, which imports
    # this module: tests/test_import_cycles.py keeps the package free of cycles.
    tensors = model.named_buffers(recurse=True)
    if not buffers_only:
        tensors = itertools.chain(model.named_parameters(recurse=True), tensors)
    for name, tensor in tensors:
        own = dtype_byte_size(tensor.dtype)
        if name in special:
            size = tensor.numel() * special[name]
        elif dtype_size is None or str(tensor.dtype).startswith(_NON_CASTING_PREFIXES):
            size = tensor.numel() * own
        else:
            size = tensor.numel() * min(dtype_size, own)
        parts = name.split(".")
        for depth in range(len(parts) + 1):
            sizes[".".join(parts[:depth])] += size
    return sizes


def compute_module_total_buffer_size(model, dtype=None, special_dtypes=None):
    return compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes, buffers_only=True).get("", 0)


def _is_unsplittable(item, no_split_module_classes) -> bool:
    if not isinstance(item, nn.Module):
        return True
    return not any(True for _ in item.children()) or type(item).__name__ in no_split_module_classes


def get_max_layer_size(modules, module_sizes, no_split_module_classes):
    """The largest "layer" among `modules` (a module without children, a no-split block, or a tensor):
    `(size, [names of the layers of that size])`, scanned depth first."""
    best, names = 0, []
    pending = list(modules)
    while pending:
        name, item = pending.pop(0)
        if _is_unsplittable(item, no_split_module_classes):
            size = module_sizes[name]
            if size > best:
                best, names = size, [name]
            elif size == best:
                names.append(name)
        else:
            pending = [(f"{name}.{child}", module) for child, module in item.named_children()] + pending
    return best, names


def get_module_leaves(module_sizes):
    child_count = defaultdict(int)
    for name in module_sizes:
        if name and "." in name:
            child_count[name.rsplit(".", 1)[0]] += 1
    return [name for name in module_sizes if name and child_count[name] == 0]


def calculate_maximum_sizes(model):
    """`(total size, (largest layer size, [names]))`, splitting at `model._no_split_modules` if it has them."""
    sizes = compute_module_sizes(model)
    no_split = getattr(model, "_no_split_modules", None) or []
    largest = get_max_layer_size(_top_level_items(model), sizes, no_split)
    return sizes[""], largest


def _top_level_items(model):
    return [*model.named_parameters(recurse=False), *model.named_children(), *model.named_buffers(recurse=False)]


# -- memory budgets --------------------------------------------------------------------------------------------
def _accelerator_count() -> int:
    """GPUs that integer device keys stand for (CUDA; hasten's device maps do not cover NPU/XPU/MLU yet)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return backend is not None and backend.is_available()


def get_max_memory(max_memory=None):
    """Bytes each device may hold: measured free memory when `max_memory` is None, else `max_memory` with sizes
    converted to ints and devices ordered GPUs (by index), "mps", "cpu", "disk"."""
    import psutil

    if max_memory is None:
        budgets = {}
        integrated = False
        for index in range(_accelerator_count()):
            try:
                torch.tensor([0], device=index)
                budgets[index] = torch.cuda.mem_get_info(index)[0]
                integrated = integrated or getattr(torch.cuda.get_device_properties(index), "is_integrated", False)
            except Exception:  # an unusable device is skipped, as the ones after it may work
                logger.info("Device %d seems unavailable; trying the next ones", index)
        # MPS and integrated GPUs share host RAM: a separate CPU budget would count it twice.
        if _mps_available():
            budgets["mps"] = psutil.virtual_memory().available
        elif not integrated:
            budgets["cpu"] = psutil.virtual_memory().available
        return budgets

    converted = {key: convert_file_size_to_int(value) if isinstance(value, str) else value
                 for key, value in max_memory.items()}
    for key, value in converted.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            raise DeviceMapError(f"max_memory[{key!r}] is {value}; give each device a budget >= 0")
    gpus = sorted(key for key in converted if isinstance(key, int) and not isinstance(key, bool))
    count = _accelerator_count()
    for index in gpus:
        if index < 0 or index >= count:
            logger.warning("Device %d is not available, available devices are %s", index, list(range(count)))
    order = gpus + [key for key in ("mps", "cpu", "disk") if key in converted]
    unknown = [key for key in converted if key not in order]
    if unknown:
        raise DeviceMapError(
            f"max_memory names unknown device(s) {unknown}; use integers for GPUs, 'mps', 'cpu' and 'disk'"
        )
    return {key: converted[key] for key in order}


def get_balanced_memory(model, max_memory=None, no_split_module_classes=None, dtype=None, special_dtypes=None,
                        low_zero: bool = False):
    """A `max_memory` for `infer_auto_device_map` that spreads the model evenly over the GPUs (with
    `low_zero`, GPU 0 gets only what the others cannot hold, leaving it free for e.g. generation)."""
    user_set = max_memory is not None
    max_memory = get_max_memory(max_memory)
    gpu_kind = "mps" if _mps_available() else None
    gpus = [key for key in max_memory if (isinstance(key, int) or key == gpu_kind) and max_memory[key] > 0]
    if not gpus:
        return max_memory
    if len(gpus) == 1:
        low_zero = False  # nothing to balance against
        if not user_set:
            # Measured memory: keep 10% free for activations.
            first = next((key for key in max_memory if isinstance(key, int)), None)
            if first is not None:
                max_memory[first] *= 0.9
    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    per_gpu = sizes[""] // (len(gpus) - 1 if low_zero else len(gpus))

    # Splitting exactly model_size / n leaves each GPU a little short and spills the tail; add a margin of the
    # largest no-split block or the mean final-module size, whichever is larger.
    no_split = _as_class_names(no_split_module_classes)
    block = 0
    if no_split:
        modules = dict(model.named_modules())
        found = {}
        for name, size in sizes.items():
            if not name or name not in modules:
                continue
            class_name = type(modules[name]).__name__
            if class_name in no_split and class_name not in found:
                found[class_name] = size
            if set(found) == set(no_split):
                break
        block = max(found.values()) if found else 0
    tensor_leaves = set(get_module_leaves(sizes))
    module_sizes = {name: size for name, size in sizes.items() if name not in tensor_leaves}
    final_modules = get_module_leaves(module_sizes)
    mean_final = int(sum(module_sizes[name] for name in final_modules) / max(len(final_modules), 1))
    per_gpu += int(1.25 * max(block, mean_final))

    indices = sorted(key for key, value in max_memory.items() if isinstance(key, int) and value > 0)
    # The last GPU keeps its whole budget in case the margin was not enough.
    for index in indices[:-1]:
        max_memory[index] = min(max_memory[indices[0]] if low_zero and index == indices[0] else per_gpu,
                                max_memory[index])
    if low_zero:
        others = sum(max_memory[index] for index in indices[1:])
        max_memory[indices[0]] = min(max(0, sizes[""] - others), max_memory[indices[0]])
    return max_memory


def _as_class_names(no_split_module_classes) -> list:
    if no_split_module_classes is None:
        return []
    if isinstance(no_split_module_classes, str):
        return [no_split_module_classes]
    return list(no_split_module_classes)


# -- tied parameters -------------------------------------------------------------------------------------------
def find_tied_parameters(model, **kwargs):
    """Groups of parameter names that are one parameter object (each group sorted), e.g. embeddings tied to
    the output layer: `[['embed.weight', 'head.weight']]`."""
    names_by_param = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names_by_param.setdefault(id(param), (param, []))[1].append(name)
    return [sorted(names) for _param, names in names_by_param.values() if len(names) > 1]


def check_tied_parameters_in_config(model) -> bool:
    """Whether a transformers model's config says some weights should be tied."""
    if "PreTrainedModel" not in [cls.__name__ for cls in inspect.getmro(type(model))]:
        return False
    config = getattr(model, "config", None)
    decoder = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    word_embeddings = bool(decoder is not None and getattr(decoder, "tie_word_embeddings", False)
                           and model.get_output_embeddings())
    encoder_decoder = bool(config is not None and getattr(config, "is_encoder_decoder", False)
                           and getattr(config, "tie_encoder_decoder", False))
    tied_modules = any(hasattr(module, "_tie_weights") for module in model.modules())
    return word_embeddings or encoder_decoder or tied_modules


def _device_of(name: str, device_map):
    """The device the map gives `name`: its own entry or the longest enclosing module's."""
    probe = name
    while True:
        if probe in device_map:
            return device_map[probe]
        if not probe:
            raise DeviceMapError(f"the device_map gives no device for {name!r}; add it (or a module holding it)")
        probe = probe.rsplit(".", 1)[0] if "." in probe else ""


def check_tied_parameters_on_same_device(tied_params, device_map):
    for group in tied_params:
        devices = {name: _device_of(name, device_map) for name in group}
        if len(set(devices.values())) > 1:
            logger.warning("Tied parameters are on different devices: %s. Put their modules on one device in your "
                           "device_map, or use device_map='auto'.", devices)


def check_device_map(model, device_map):
    """Warn about keys that name no module/tensor of the model (under hasten's `strict` setting: raise
    `DeviceMapError`); raise if the map leaves some weight without a device."""
    if not isinstance(device_map, dict):
        raise DeviceMapError(f"device_map must be a dict of module name -> device, got {type(device_map).__name__}")
    known = (set(dict(model.named_modules())) | set(model.state_dict())
             | {name for name, _ in model.named_buffers()} | {name for name, _ in model.named_parameters()})
    missing = [key for key in device_map if key != "" and key not in known]
    if missing:
        top = [name for name, _ in model.named_children()]
        from ..config.resolve import strict

        if strict():  # a typo in a key would otherwise leave those weights where a parent key puts them
            raise DeviceMapError(
                f"device_map keys {missing} name no module of the model ({type(model).__name__}), whose top-level "
                f"modules are {top[:8]}; fix or remove them (an error under hasten's strict setting)"
            )
        # Accelerate warns and goes on (its words first; users' filters match them): the keys place nothing
        warnings.warn(
            f"The following device_map keys do not match any submodules in the model: {missing}; they place "
            f"nothing. Fix or remove them (the model ({type(model).__name__})'s top-level modules are {top[:8]})",
            UserWarning, stacklevel=2,
        )
    if "" in device_map:
        return
    prefixes = tuple(key + "." for key in device_map)
    uncovered = [name for name in model.state_dict() if name not in device_map and not name.startswith(prefixes)]
    if uncovered:
        raise DeviceMapError(
            f"the device_map gives no device for {len(uncovered)} weight(s): {', '.join(uncovered[:5])}"
            f"{'...' if len(uncovered) > 5 else ''}; add their modules to it (or map '' to a device)"
        )


# -- the allocator ---------------------------------------------------------------------------------------------
def clean_device_map(device_map, module_name: str = ""):
    """Merge every module whose entries all share one device into a single entry (in place; returned)."""
    prefix = f"{module_name}." if module_name else ""
    keys = [key for key in device_map if key.startswith(prefix)]
    values = [device_map[key] for key in keys]
    if len(values) > 1 and len(set(values)) == 1:
        rebuilt = OrderedDict()
        for key, value in device_map.items():
            if key in keys:
                if module_name not in rebuilt:
                    rebuilt[module_name] = values[0]
            else:
                rebuilt[key] = value
        device_map.clear()
        device_map.update(rebuilt)
    depth = len(module_name.split(".")) + 1 if module_name else 1
    children = []
    for key in list(device_map):
        if key.startswith(prefix) and len(key) > len(module_name):
            child = ".".join(key.split(".")[:depth])
            if child not in children:
                children.append(child)
    for child in children:
        clean_device_map(device_map, module_name=child)
    return device_map


def _outside_ties(name, tied_parameters):
    """Names tied to a parameter inside `name` that live outside it (same containment test as Accelerate:
    a dotted substring match)."""
    inside = name + "."
    groups = [g for g in tied_parameters if any(inside in k + "." for k in g) and not all(inside in k + "." for k in g)]
    return [p for group in groups for p in group if inside not in p + "."]


def get_module_size_with_ties(tied_params, module_size, module_sizes, modules_to_treat):
    """Size of a module plus the pending modules its tied parameters live in, and those modules."""
    names, modules, total = [], [], module_size
    for param in tied_params:
        owner = next(((n, m) for n, m in modules_to_treat if param.startswith(n + ".")), None)
        if owner is None:  # its module is already placed
            continue
        names.append(owner[0])
        modules.append(owner[1])
        total += module_sizes[owner[0]] - module_sizes[param]
    return total, names, modules


def _children_items(module):
    return [*module.named_parameters(recurse=False), *module.named_children()]


def fallback_allocate(modules, module_sizes, size_limit, no_split_module_classes=None, tied_parameters=None):
    """Breadth-first search for a module (or piece of one) of at most `size_limit` bytes: `(name, module,
    remaining modules)`, or `(None, None, modules)`."""
    try:
        size_limit = convert_file_size_to_int(size_limit)
    except ValueError:
        return None, None, modules
    no_split = no_split_module_classes or []
    tied_parameters = tied_parameters or []
    search = list(modules)
    found = None
    while search:
        name, item = search.pop(0)
        size, _, _ = get_module_size_with_ties(_outside_ties(name, tied_parameters), module_sizes[name],
                                               module_sizes, search)
        if size <= size_limit:
            found = name
            break
        if _is_unsplittable(item, no_split):
            continue
        search = [(f"{name}.{n}", v) for n, v in _children_items(item)] + search
    if found is None:
        return None, None, modules
    # Replace each enclosing module in the list by its pieces until the found one is listed itself.
    for cut in [i for i, c in enumerate(found) if c == "."]:
        parent = found[:cut]
        names = [n for n, _ in modules]
        if parent in names:
            index = names.index(parent)
            pieces = [(f"{parent}.{n}", v) for n, v in _children_items(modules[index][1])]
            modules = modules[:index] + pieces + modules[index + 1:]
    index = [n for n, _ in modules].index(found)
    name, item = modules.pop(index)
    return name, item, modules


def infer_auto_device_map(model, max_memory=None, no_split_module_classes=None, dtype=None, special_dtypes=None,
                          verbose: bool = False, clean_result: bool = True, offload_buffers: bool = False,
                          fallback_allocation: bool = False):
    """A device map for `model` (may live on `meta`) that fills GPUs first, then CPU, then disk, keeping room on
    the first GPU and the CPU for the largest layer. Returns an OrderedDict module name -> device."""
    max_memory = get_max_memory(max_memory)
    no_split = _as_class_names(no_split_module_classes)
    devices = list(max_memory)
    if "disk" not in devices:
        devices.append("disk")
    gpus = [d for d in devices if d not in ("cpu", "disk")]
    main_devices = ["mps"] if "mps" in gpus else [gpus[0], "cpu"] if gpus else ["cpu"]
    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    tied_parameters = find_tied_parameters(model)
    if check_tied_parameters_in_config(model) and not tied_parameters:
        logger.warning("The model weights are not tied. Call the model's `tie_weights()` before "
                       "`infer_auto_device_map`.")
    say = print if verbose else (lambda *a, **k: None)

    pending = _top_level_items(model)
    device_map = OrderedDict()
    current = 0
    used = {device: 0 for device in devices}
    buffer_sizes = defaultdict(int)
    minimum_needed = {}

    def modules_only(items):
        return [(n, m) for n, m in items if isinstance(m, nn.Module)]

    largest, largest_names = get_max_layer_size(pending, sizes, no_split)
    while pending:
        name, item = pending.pop(0)
        say(f"\nTreating module {name}.")
        # The largest layer may just have been taken: find the next one.
        largest_names = [n for n in largest_names if n != name and not n.startswith(name + ".")]
        if not largest_names:
            largest, largest_names = get_max_layer_size(modules_only(pending), sizes, no_split)
        size = sizes[name]
        tied = _outside_ties(name, tied_parameters)
        device = devices[current]
        budget = None if device == "disk" else max_memory[device]
        reserved = 0
        if device in main_devices:
            budget -= largest
            reserved = largest
        size_with_ties, tied_names, tied_modules = get_module_size_with_ties(tied, size, sizes, pending)

        if budget is None or used[device] + size_with_ties <= budget:
            say(f"Putting {name} (size={size}) and {tied_names} on {device}.")
            used[device] += size_with_ties
            device_map[name] = device
            for tied_name in tied_names:
                pending = [(n, m) for n, m in pending if n != tied_name]
                device_map[tied_name] = device
            if not offload_buffers and isinstance(item, nn.Module):
                buffer_sizes[device] += compute_module_total_buffer_size(item, dtype=dtype,
                                                                         special_dtypes=special_dtypes)
            continue

        if tied and used[device] + size <= budget:
            # The module fits alone: try to split one of its tied modules so that only a piece comes along.
            split = False
            for tied_name, tied_module in zip(tied_names, tied_modules):
                if _is_unsplittable(tied_module, no_split):
                    continue
                say(f"Splitting {tied_name}.")
                pieces = [(f"{tied_name}.{n}", v) for n, v in _children_items(tied_module)]
                index = [n for n, _ in pending].index(tied_name)
                pending = [(name, item)] + pending[:index] + pieces + pending[index + 1:]
                largest, largest_names = get_max_layer_size(modules_only(pending), sizes, no_split)
                split = True
                break
            if split:
                continue
            say("None of the tied modules can be split; going to the next device.")

        if used[device] + size >= budget and not _is_unsplittable(item, no_split):
            say(f"Not enough space on {device} for {name} (size {size}); splitting it.")
            pending = [(f"{name}.{n}", v) for n, v in _children_items(item)] + pending
            largest, largest_names = get_max_layer_size(modules_only(pending), sizes, no_split)
            continue

        if used[device] == 0 and fallback_allocation and device != "disk":
            limit = max_memory[device] - max(largest, size_with_ties)
            found_name, found, rest = fallback_allocate(pending, sizes, limit - used[device], no_split,
                                                        tied_parameters)
            if found is not None:
                pending = [(found_name, found), (name, item)] + rest
                continue

        if used[device] == 0:
            minimum_needed[device] = size_with_ties + reserved
        used[device] += reserved
        current += 1
        pending.insert(0, (name, item))

    used = {device: amount for device, amount in used.items() if amount > 0}
    if clean_result:
        device_map = clean_device_map(device_map)

    offloaded_buffers = buffer_sizes.get("cpu", 0) + buffer_sizes.get("disk", 0)
    if offloaded_buffers > 0 and not offload_buffers and gpus:
        fits = any(limit >= offloaded_buffers + used.get(device, 0)
                   for device, limit in max_memory.items() if device not in ("cpu", "disk"))
        if not fits:
            warnings.warn(f"The offloaded layers need {offloaded_buffers} bytes of buffers on the GPU, which fit no "
                          "GPU's remaining memory; pass offload_buffers=True if you run out of memory.")
    if minimum_needed:
        # A warning, as in Accelerate: a budget that fits nothing usually means a typo or a unit mistake.
        logger.warning("infer_auto_device_map: insufficient memory to place any module on %s (bytes each would "
                       "need); raise their max_memory to use them.",
                       ", ".join(f"{device}: {amount}" for device, amount in minimum_needed.items()))
    return device_map
