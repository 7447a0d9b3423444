"""The CPU guard for a bug class no CPU run can show: a tensor made where NCCL cannot serve it.

On a GPU the default group is NCCL, which serves no CPU tensor ("No backend type associated with device type
cpu"). A flag made with `torch.tensor([...])` (no `device=`) and all-reduced on the default group works on
every CPU test and stops every GPU run. This test reads `src/hasten` and fails on the construct it forbids:

    a tensor made by a torch factory (torch.tensor, torch.zeros, ...) and handed to a torch.distributed
    collective, either without an explicit `device=`, or with a CPU device outside the control group
    (`group=control_group()`, or a group made by `new_group(backend="gloo")`).

Barriers count too: `dist.barrier()` on the default group guesses an NCCL device; use `control.barrier()`.
A call reviewed as safe carries `# collective-ok: <why>` on its line.
"""

from __future__ import annotations

import ast
from pathlib import Path

from source_rules import dotted

SRC = Path(__file__).resolve().parents[2] / "src" / "hasten"

COLLECTIVES = {
    "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
    "reduce", "gather", "scatter", "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv", "barrier",
}
FACTORIES = {
    "tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "rand", "randn", "randint", "linspace",
    "eye", "from_numpy", "LongTensor", "FloatTensor", "IntTensor", "ByteTensor", "BoolTensor",
}
DIST_NAMES = {"dist", "c10d", "distributed", "distributed_c10d"}
WAIVER = "# collective-ok:"



def _collective_name(call: ast.Call) -> str | None:
    name = dotted(call.func)
    head, _, last = name.rpartition(".")
    if last in COLLECTIVES and head and head.split(".")[-1] in DIST_NAMES:
        return last
    return None


def _factory(node) -> str | None:
    if isinstance(node, ast.Call):
        name = dotted(node.func)
        if name.startswith("torch.") and name.split(".")[-1] in FACTORIES and name.count(".") == 1:
            return name
    return None


def _is_cpu(node) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.split(":")[0] == "cpu"
    if isinstance(node, ast.Call) and dotted(node.func) == "torch.device" and node.args:
        return _is_cpu(node.args[0])
    return False


def _assignments(scope) -> dict:
    """name (or dotted attribute) -> every expression assigned to it in `scope`."""
    found: dict = {}
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                found.setdefault(dotted(target), []).append(node.value)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            found.setdefault(dotted(node.target), []).append(node.value)
    return found


def _is_control_group(node, module_assignments: dict) -> bool:
    """`control_group()`, a gloo `new_group`, or a name/attribute assigned one of those in the module."""
    if node is None:
        return False
    if isinstance(node, ast.Call):
        name = dotted(node.func)
        if name.split(".")[-1] == "control_group":
            return True
        if name.split(".")[-1] == "new_group":
            return any(k.arg == "backend" and isinstance(k.value, ast.Constant) and k.value.value == "gloo"
                       for k in node.keywords)
        if name.split(".")[-1] == "background_group":  # checkpoint/async_save's gloo groups
            return True
        return False
    name = dotted(node)
    return bool(name) and any(_is_control_group(v, {}) for v in module_assignments.get(name, []))


def _tensor_args(call: ast.Call) -> list:
    args = list(call.args[:2])
    args += [k.value for k in call.keywords if k.arg in ("tensor", "tensor_list", "output", "input", "output_tensor",
                                                          "input_tensor", "output_tensor_list", "input_tensor_list")]
    return args


def _origins(node, local: dict, depth: int = 0, module: dict | None = None) -> list:
    """The factory calls a collective's argument may come from (through names, attributes set in other methods
    of the module, lists and comprehensions)."""
    module = module or {}
    if depth > 4:
        return []
    if _factory(node):
        return [node]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [o for item in node.elts for o in _origins(item, local, depth + 1, module)]
    if isinstance(node, ast.ListComp):
        return _origins(node.elt, local, depth + 1, module)
    if isinstance(node, (ast.Name, ast.Attribute)):
        name = dotted(node)
        values = local.get(name) or (module.get(name, []) if isinstance(node, ast.Attribute) else [])
        return [o for value in values for o in _origins(value, local, depth + 1, module)]
    return []


def violations_in(source: str, filename: str = "<source>") -> list[str]:
    """Every forbidden construct in `source`, one line each: `file:line: what, and the fix`."""
    tree = ast.parse(source)
    lines = source.splitlines()
    module_assignments = _assignments(tree)
    problems = []
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    seen = set()
    for scope in scopes + [tree]:
        local = _assignments(scope)
        for call in ast.walk(scope):
            if not isinstance(call, ast.Call) or id(call) in seen:
                continue
            operation = _collective_name(call)
            if operation is None:
                continue
            seen.add(id(call))
            if WAIVER in lines[call.lineno - 1]:
                continue
            group = next((k.value for k in call.keywords if k.arg == "group"), None)
            on_control = _is_control_group(group, module_assignments) or _is_control_group(group, local)
            where = f"{filename}:{call.lineno}"
            if operation == "barrier" and group is None:
                problems.append(f"{where}: dist.barrier() on the default group (NCCL on CUDA picks a device by "
                                f"guess); use hasten.distributed.control.barrier()")
                continue
            for arg in _tensor_args(call):
                for origin in _origins(arg, local, 0, module_assignments):
                    device = next((k.value for k in origin.keywords if k.arg == "device"), None)
                    factory = dotted(origin.func)
                    if device is None:
                        problems.append(f"{where}: {factory}(...) without device= handed to dist.{operation}; make "
                                        f"it on the CPU and use group=control_group() (a flag, count or decision), "
                                        f"or on state.device (data)")
                    elif _is_cpu(device) and not on_control:
                        problems.append(f"{where}: a CPU {factory}(...) handed to dist.{operation} outside the "
                                        f"control group (NCCL serves no CPU tensor); pass group=control_group()")
    return problems


def test_no_collective_in_src_gets_a_tensor_nccl_cannot_serve():
    problems = []
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 100  # the guard really reads the package
    for path in files:
        problems += violations_in(path.read_text(), str(path.relative_to(SRC.parent)))
    assert not problems, "\n".join(problems)


# The guard itself: it must catch issue 22's item 1 as it was written, and its siblings.

ITEM_1_BEFORE_THE_FIX = '''
def _on_any_rank(flag: bool) -> bool:
    value = torch.tensor([int(flag)])
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())
'''


def test_guard_catches_item_1_as_it_was():
    problems = violations_in(ITEM_1_BEFORE_THE_FIX)
    assert len(problems) == 1
    assert "torch.tensor(...) without device= handed to dist.all_reduce" in problems[0]


def test_guard_catches_a_cpu_tensor_outside_the_control_group_and_inline_factories():
    source = '''
def f(group):
    a = torch.zeros(1, device="cpu")
    dist.all_reduce(a)
    dist.broadcast(torch.ones(2, dtype=torch.int64, device=torch.device("cpu")), src=0, group=group)
    parts = [torch.empty(3) for _ in range(4)]
    dist.all_gather(parts, b)
'''
    problems = violations_in(source)
    assert len(problems) == 3, problems
    assert "a CPU torch.zeros(...) handed to dist.all_reduce outside the control group" in problems[0]
    assert "a CPU torch.ones(...)" in problems[1]
    assert "torch.empty(...) without device= handed to dist.all_gather" in problems[2]


def test_guard_catches_a_default_group_barrier():
    problems = violations_in("def f():\n    dist.barrier(device_ids=[0])\n")
    assert len(problems) == 1 and "dist.barrier() on the default group" in problems[0]


def test_guard_accepts_the_control_group_device_tensors_and_waivers():
    source = '''
from hasten.distributed.control import control_group

class P:
    def install(self):
        self._group = dist.new_group(backend="gloo")
    def __init__(self):
        self._flag = torch.zeros(1, dtype=torch.int64, device="cpu")
    def tick(self):
        flag = self._flag
        dist.all_reduce(flag, group=self._group)

def g(state):
    value = torch.tensor([1], device="cpu")
    dist.all_reduce(value, group=control_group())
    data = torch.zeros(4, device=state.device)
    dist.broadcast(data, src=0)
    dist.barrier(group=control_group())
    dist.barrier()  # collective-ok: the group is gloo here
'''
    assert violations_in(source) == []


def test_guard_still_rejects_a_deviceless_tensor_on_the_control_group():
    source = "def f():\n    v = torch.tensor([1])\n    dist.all_reduce(v, group=control_group())\n"
    assert len(violations_in(source)) == 1


def test_guard_follows_an_attribute_made_in_another_method():
    source = '''
class P:
    def __init__(self):
        self._flag = torch.zeros(1, dtype=torch.int64)
    def tick(self):
        flag = self._flag
        dist.all_reduce(flag, group=self._group, async_op=True)
'''
    problems = violations_in(source)
    assert len(problems) == 1 and "torch.zeros(...) without device=" in problems[0]
