"""Static (AST) anti-hack checks on a candidate's source, run before anything executes.

``run_static_checks(source)`` parses the candidate once and runs one pure
``check_<pattern>(tree, source) -> list[Finding]`` per rule. Each check's docstring names the
hack class it defends against. A candidate with any finding is rejected
(``StaticCheckResult.status == FAILED``); every finding names its rule, a ``RejectReason`` and
the line, and its message says what to do instead, so the Tester agent can explain it.

**Candidate Python is an allowlist, not a denylist.** A kernel wrapper needs very little:
allocate outputs, reshape/view, read shapes and dtypes, create weights the way the reference
does, query the current stream, compile and launch its kernels. Exactly that is allowed;
everything else is refused, wherever it appears in the module (not only in ``forward``):

- *Imports* (``check_forbidden_import``): ``IMPORTABLE_MODULES`` only (torch, torch.nn,
  torch.nn.functional, torch.nn.init, torch.utils.cpp_extension, math, typing, __future__,
  functools, itertools, collections, dataclasses, enum, multiminddev.cuda); ``from p import n``
  only where ``p.n`` is one of those modules or an allowed name. No os/sys/ctypes/cffi/numpy/
  importlib/inspect/gc, no harness internals (``multiminddev.cuda.kernels``' logs and caches).
- *Names reached through imports* (``check_torch_attributes``): every maximal ``a.b.c`` chain
  rooted at an import must be in ``ALLOWED_NAMES`` exactly (allocation and parameter creation,
  views, dtypes, ``torch.Size``/``device``/``finfo``, ``no_grad``, ``nn.Module``/``Parameter``
  and nn layer classes, ``nn.init``, read-only ``torch.cuda`` queries, ``load_inline``,
  ``compile_kernels`` and its errors, math, typing helpers). A module is never a value
  (``m = torch.cuda``, ``f(torch.backends)``, ``from torch import cuda``): modules appear only
  as the prefix of an allowed name. ``torch.library``/``torch.ops``/``torch._C`` dispatch are
  refused as dispatcher registration, the RNG (``manual_seed``...) as global-state tampering.
- *Builtins* (``check_builtins``): ``ALLOWED_BUILTINS`` (numbers, containers, iteration,
  ``isinstance``, ``super``, exceptions...); ``getattr``/``hasattr`` with literal public names
  on non-imported objects, ``setattr``/``delattr`` on ``self``, one-argument ``type``,
  ``object`` as a base only; ``eval``/``exec``/``compile``/``__import__``/``globals``/``vars``/
  ``open``/``id``/``hash`` never.
- *Attribute names* (``check_attribute_names``): no dunder attributes but
  ``super().__init__``; no frame/generator/coroutine/traceback/code attributes; no private
  attributes of objects the candidate does not own; no hooks, CUDA events, tensor storage,
  pinned host memory, or the harness-side attributes of kernel handles.
- *Host reads in forward* (``check_host_reads``): no ``.item()``/``.tolist()``/``.cpu()``/
  ``int(t)``/``if t:``/``.data_ptr()`` on values derived from the inputs (they key caches by
  value); weights set in ``__init__`` may be read.

On top of the allowlist, pattern checks catch the classic hacks that use only allowed names:
torch compute in ``forward`` and its helpers, using the reference ``Model``, try/except
fallbacks, threads and side streams, finalizers, monkey-patching, file access, pointer-keyed caches,
returning an input, precision downgrades (read from CUDA *code*: comments and string literals
are blanked first, inline PTX kept), and rules for native ``load_inline`` C++ (torch ops,
side streams, ``system()``, ``TORCH_LIBRARY`` registrations, cuBLAS/cuDNN calls).

What static checks cannot do: prove what runs. The runtime guards (``env/guards.py``: a
TorchDispatchMode during ``forward``, input/output/stream/thread checks, stale-output and
roofline checks), the dispatcher-registration snapshot (``env/registry_guard.py``) and the
sandbox (``env/sandbox.py``) cover what executes.

Kernel handles: names, ``self``/class attributes, functions and methods that hold or return
compiled kernels (``compile_kernels(...)``, ``load_inline(...)``, ``def _kernels(): return
compile_kernels(SRC)``, ``@functools.cache`` builders, properties) are tracked to a fixed
point (``kernel_value``), so calling them is a launch, never torch compute.

Tensor tracking is a flow-insensitive heuristic: names bound to ``forward``'s parameters, to
``self`` tensors (``nn.Parameter``, buffers), to results of torch calls and views, and to
expressions over those are tensors; arithmetic on them is torch compute, while arithmetic on
shapes, sizes and ints (``(n + 255) // 256``) is not.
"""

from __future__ import annotations

import ast
import builtins
import enum
import functools
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from multiminddev import pyast
from multiminddev.cuda.compiler import define_options
from multiminddev.env import include_rules
from multiminddev.env.results import Finding, RejectReason, StageStatus, StaticCheckResult

# ---------------------------------------------------------------------------------------------
# Policy tables (frozen: checks read them, nothing mutates them)
# ---------------------------------------------------------------------------------------------

# Torch functions allowed in forward: allocation, views, shape queries, stream/device queries.
ALLOWED_TORCH_FUNCTIONS = frozenset(
    {
        *(f"torch.{n}" for n in (
            "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like",
            "full", "full_like", "reshape", "flatten", "unflatten", "permute", "transpose", "t",
            "squeeze", "unsqueeze", "narrow", "as_strided", "broadcast_to", "movedim",
            "swapaxes", "chunk", "split", "unbind", "select", "is_tensor", "numel", "device",
            "Size", "finfo", "iinfo", "get_default_dtype", "no_grad", "inference_mode",
            "is_grad_enabled", "broadcast_shapes", "is_floating_point", "is_complex",
        )),
        *(f"torch.cuda.{n}" for n in (
            "current_stream", "current_device", "is_available", "device_count", "device",
            "get_device_properties", "get_device_capability", "get_device_name", "synchronize",
        )),
        "torch.utils.cpp_extension.load_inline",
        "torch.nn.Parameter",
    }
)
# Torch functions returning non-tensors (so arithmetic on their results is fine).
NON_TENSOR_TORCH_FUNCTIONS = frozenset(
    n for n in ALLOWED_TORCH_FUNCTIONS
    if n.startswith("torch.cuda.") or n.rsplit(".", 1)[1] in {
        "is_tensor", "numel", "device", "Size", "finfo", "iinfo", "get_default_dtype",
        "no_grad", "inference_mode", "is_grad_enabled", "broadcast_shapes",
        "is_floating_point", "is_complex",
    }
)
# Tensor methods allowed in forward, split by whether they return a tensor.
VIEW_METHODS = frozenset(
    {
        "contiguous", "view", "view_as", "reshape", "reshape_as", "permute", "transpose", "t",
        "flatten", "unflatten", "unsqueeze", "squeeze", "expand", "expand_as", "narrow",
        "as_strided", "detach", "new_empty", "new_zeros", "new_ones", "new_full",
        "new_empty_strided", "zero_", "fill_", "to", "float", "cuda", "movedim", "swapaxes",
        "chunk", "split", "unbind", "select", "requires_grad_",
    }
)
QUERY_METHODS = frozenset(
    {
        "size", "stride", "numel", "nelement", "dim", "ndimension", "data_ptr", "element_size",
        "is_contiguous", "storage_offset", "item", "get_device", "is_floating_point",
        "is_complex", "tolist",
    }
)
NON_TENSOR_ATTRIBUTES = frozenset(
    {"shape", "dtype", "device", "ndim", "is_cuda", "layout", "requires_grad", "itemsize",
     "nbytes", "is_leaf", "grad_fn", "names"}
)
TENSOR_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "data", "real", "imag"})
# Builtins that may take a tensor without computing on it.
HARMLESS_BUILTINS = frozenset(
    {"len", "isinstance", "type", "int", "float", "bool", "print", "hasattr", "getattr", "repr",
     "str", "super", "tuple", "list"}
)

BUILTIN_NAMES = frozenset(dir(builtins))
CONCURRENCY_MODULES = frozenset(
    {"threading", "_thread", "multiprocessing", "concurrent", "asyncio", "subprocess", "sched",
     "queue", "torch.multiprocessing"}
)
# torch names that run work outside the timed stream or replay it: side streams, events, graphs.
CONCURRENCY_TORCH = frozenset(
    f"torch.{n}" for n in (
        "cuda.Stream", "cuda.Event", "cuda.graph", "cuda.CUDAGraph", "cuda.stream",
        "cuda.ExternalStream", "cuda.set_stream", "cuda.default_stream", "cuda.graphs",
        "cuda.make_graphed_callables", "Stream", "Event", "cuda.streams", "multiprocessing",
        "futures", "jit.fork", "jit.wait",
    )
)
# Tensor methods whose result may share the storage of the tensor they are called on: views,
# and conversions that return the tensor itself when there is nothing to convert
# (``x.contiguous()``, ``x.float()``, ``x.to(x.device)``). The new_* allocators do not.
ALIAS_METHODS = VIEW_METHODS - {"new_empty", "new_zeros", "new_ones", "new_full",
                                "new_empty_strided"}
ALIAS_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "data", "real"})
# torch functions (and nn.Parameter) whose result shares its first argument's storage.
ALIAS_TORCH_FUNCTIONS = frozenset(
    {*(f"torch.{n}" for n in ("reshape", "flatten", "unflatten", "permute", "transpose", "t",
                              "squeeze", "unsqueeze", "narrow", "as_strided", "broadcast_to",
                              "movedim", "swapaxes", "chunk", "split", "unbind", "select")),
     "torch.nn.Parameter"})
LOW_PRECISION_DTYPES = frozenset(
    {"torch.float16", "torch.half", "torch.bfloat16", "torch.float8_e4m3fn", "torch.float8_e5m2"}
)
LOW_PRECISION_METHODS = frozenset({"half", "bfloat16"})
# What a tensor expression's attribute may name when it is not called on the spot: what may be
# called (views, queries), plain attributes, and the tensors behind T/mT/data.
TENSOR_VALUE_ATTRIBUTES = (VIEW_METHODS | QUERY_METHODS | LOW_PRECISION_METHODS
                           | NON_TENSOR_ATTRIBUTES | TENSOR_ATTRIBUTES)
# Low-precision types and intrinsics in CUDA code (read after comments and strings are blanked,
# so a float32 kernel whose comment says ``__half`` passes). ``half`` alone is also a common
# variable name (``int half = n / 2``), so it counts only where it is used as a type.
LOW_PRECISION_CUDA = re.compile(
    r"\b(__half2?|half2|__nv_bfloat162?|nv_bfloat162?|__float2half\w*|__floats2half2\w*|"
    r"__float2bfloat16\w*|__h(add|sub|mul|div|fma|max|min|neg)2?(_rn|_sat)?|__float_to_tf32|"
    r"tf32|__nv_fp8\w*)\b|"
    r"\bconst\s+half\b|\bhalf\s*\*\s*__restrict__|<\s*(const\s+)?half\s*[*>]|"
    r"\bhalf\s+[A-Za-z_]\w*\s*[=;\[,)]")
# Inside inline PTX (asm strings are code): reduced-precision types of cvt/mma/wgmma.
LOW_PRECISION_PTX = re.compile(r"\.(tf32|f16|bf16|f16x2|bf16x2|e4m3|e5m2)\b")
FILE_FUNCTIONS = frozenset(
    {"open", "io.open", "numpy.load", "numpy.fromfile", "numpy.loadtxt", "numpy.genfromtxt",
     "numpy.memmap", "numpy.save", "numpy.savez", "torch.load", "torch.save", "torch.from_file",
     "torch.utils.cpp_extension.load", "pickle.load", "pickle.loads", "marshal.load",
     "pathlib.Path", "pathlib.PurePath", "os.open", "os.listdir", "os.scandir"}
)
FILE_METHODS = frozenset({"read_text", "read_bytes", "write_text", "write_bytes", "open"})
CACHE_DECORATORS = frozenset({"functools.lru_cache", "functools.cache", "functools.cached_property"})
KERNEL_BUILDERS = frozenset(
    {"multiminddev.cuda.compile_kernels", "multiminddev.cuda.kernels.compile_kernels",
     "torch.utils.cpp_extension.load_inline", "torch.utils.cpp_extension.load"}
)


# Order of findings in a result: the first is the EvalResult's reject_reason, counted in metrics,
# so the specific hack class comes before generic rules (``import time`` + patching
# ``time.perf_counter`` counts as monkey_patch, not forbidden_import).
REASON_PRIORITY = (
    RejectReason.SYNTAX, RejectReason.NO_MODEL_NEW, RejectReason.REFERENCE_USE,
    RejectReason.MONKEY_PATCH, RejectReason.POINTER_CACHE, RejectReason.CONCURRENCY,
    RejectReason.TRY_EXCEPT_FALLBACK, RejectReason.FILE_ACCESS, RejectReason.PRECISION_DOWNGRADE,
    RejectReason.OUTPUT_ALIASING, RejectReason.NO_KERNEL, RejectReason.TORCH_COMPUTE,
    RejectReason.FORBIDDEN_IMPORT, RejectReason.OTHER,
)


def _finding(rule: str, reason: RejectReason, message: str, node: ast.AST | None) -> Finding:
    return Finding(rule=rule, reason=reason, message=message, line=getattr(node, "lineno", None))


# ---------------------------------------------------------------------------------------------
# Module analysis shared by the checks (pure functions of the tree)
# ---------------------------------------------------------------------------------------------


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _root(node: ast.AST) -> ast.AST:
    """The innermost receiver of an Attribute/Subscript/Call chain (``a`` in ``a.b[0].c()``)."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call, ast.Starred)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def import_aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> fully qualified name for every import and module-qualified alias."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    aliases[a.asname] = a.name
                else:
                    top = a.name.split(".")[0]
                    aliases[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    # ``mm = torch.matmul`` / ``F2 = F``: plain aliases of imported names, anywhere.
    for _ in range(2):
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, dotted = node.targets[0], _dotted(node.value)
                if isinstance(target, ast.Name) and dotted and dotted.split(".")[0] in aliases:
                    aliases.setdefault(target.id, _resolve_dotted(dotted, aliases))
    return aliases


def _resolve_dotted(dotted: str, aliases: dict[str, str]) -> str:
    head, _, rest = dotted.partition(".")
    base = aliases.get(head, head)
    return f"{base}.{rest}" if rest else base


def resolve(node: ast.AST, aliases: dict[str, str]) -> str | None:
    dotted = _dotted(node)
    return _resolve_dotted(dotted, aliases) if dotted else None


@dataclass(kw_only=True)
class ModuleInfo:
    """What the checks need to know about the candidate module, computed once."""

    tree: ast.Module
    aliases: dict[str, str]
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]
    classes: dict[str, ast.ClassDef]
    model_new: ast.ClassDef | None
    kernel_holders: set[str] = field(default_factory=set)  # names bound to compiled kernels
    kernel_factories: set[str] = field(default_factory=set)  # names of functions returning them
    self_holders: set[str] = field(default_factory=set)  # self.<attr> bound to compiled kernels
    self_factories: set[str] = field(default_factory=set)  # methods of ModelNew returning them
    self_tensors: set[str] = field(default_factory=set)  # self.<attr> holding tensors
    self_modules: dict[str, str] = field(default_factory=dict)  # self.<attr> -> torch module/class
    self_callables: dict[str, str] = field(default_factory=dict)  # self.<attr> = torch.fn
    scopes: list[FunctionScope] | None = None  # reachable_scopes(), computed once

    def methods(self, cls: ast.ClassDef) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
        """Methods of ``cls`` and of its bases defined in this module (subclass wins)."""
        found: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        for base in cls.bases:
            if isinstance(base, ast.Name) and base.id in self.classes and base.id != cls.name:
                found.update(self.methods(self.classes[base.id]))
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found[node.name] = node
        return found

    @property
    def forward(self) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        return self.methods(self.model_new).get("forward") if self.model_new else None


def _is_builder_call(node: ast.AST, aliases: dict[str, str]) -> bool:
    return isinstance(node, ast.Call) and resolve(node.func, aliases) in KERNEL_BUILDERS


def _self_attr(node: ast.AST) -> str | None:
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == "self"):
        return node.attr
    return None


def _assignments(tree: ast.AST) -> Iterator[tuple[ast.AST, ast.AST]]:
    """(target, value) for every simple assignment in ``tree`` (tuple targets unpacked)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            pairs = [(t, node.value) for t in node.targets]
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            pairs = [(node.target, node.value)]
        elif isinstance(node, ast.Call) and _dotted(node.func) in {"setattr"} and len(node.args) == 3:
            obj, name, value = node.args
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                pairs = [(ast.Attribute(value=obj, attr=name.value, ctx=ast.Store()), value)]
            else:
                pairs = []
        else:
            pairs = []
        for target, value in pairs:
            if isinstance(target, (ast.Tuple, ast.List)):
                for elt in target.elts:
                    yield elt, value
            else:
                yield target, value


class KernelValue(str, enum.Enum):
    """What an expression evaluates to, as far as kernel launches are concerned."""

    HANDLE = "handle"  # compiled kernels, one kernel, an extension module/function: launchable
    FACTORY = "factory"  # a function/method returning a HANDLE (``def _kernels(): return ...``)


def kernel_value(node: ast.AST, info: ModuleInfo) -> KernelValue | None:
    """HANDLE, FACTORY or None for ``node``, from the module's kernel bindings.

    Calling a FACTORY gives a HANDLE (``_kernels().relu``); an attribute or item of a HANDLE is
    a HANDLE (``kernels.relu``, ``KS["relu"]``); calling a HANDLE is a launch (its value is the
    launch's result, not kernels). Containers are handles only when every non-constant element
    is one, so a tuple cannot smuggle a torch function in next to a kernel.
    """
    if _is_builder_call(node, info.aliases):
        return KernelValue.HANDLE
    if isinstance(node, ast.Name):
        if node.id in info.kernel_holders:
            return KernelValue.HANDLE
        return KernelValue.FACTORY if node.id in info.kernel_factories else None
    if isinstance(node, ast.Attribute):
        if _self_attr(node) is not None or (isinstance(node.value, ast.Name)
                                            and node.value.id in info.classes):
            if node.attr in info.self_holders:
                return KernelValue.HANDLE
            return KernelValue.FACTORY if node.attr in info.self_factories else None
        if _own_instance_holds_kernel(node, info):
            return KernelValue.HANDLE
        return KernelValue.HANDLE if kernel_value(node.value, info) is KernelValue.HANDLE else None
    if isinstance(node, ast.Subscript):
        return KernelValue.HANDLE if kernel_value(node.value, info) is KernelValue.HANDLE else None
    if isinstance(node, ast.Call):
        if _is_kernel_table_get(node, info):
            return KernelValue.HANDLE
        return KernelValue.HANDLE if kernel_value(node.func, info) is KernelValue.FACTORY else None
    if isinstance(node, (ast.Tuple, ast.List, ast.Dict, ast.IfExp)):
        parts = (node.elts if isinstance(node, (ast.Tuple, ast.List)) else node.values
                 if isinstance(node, ast.Dict) else [node.body, node.orelse])
        values = [p for p in parts if not isinstance(p, ast.Constant)]
        if values and all(kernel_value(p, info) is KernelValue.HANDLE for p in values):
            return KernelValue.HANDLE
        return None
    if isinstance(node, ast.Lambda):
        return KernelValue.FACTORY if kernel_value(node.body, info) is KernelValue.HANDLE else None
    return None


def _is_kernel_table_get(call: ast.Call, info: ModuleInfo) -> bool:
    """``table.get(block_size, kernels.relu_128)``: a kernel picked from a table of kernels with
    a kernel as the default, so whichever is found is a kernel."""
    func = call.func
    return (isinstance(func, ast.Attribute) and func.attr == "get" and len(call.args) == 2
            and not call.keywords and kernel_value(func.value, info) is KernelValue.HANDLE
            and kernel_value(call.args[1], info) is KernelValue.HANDLE)


def _holds_kernels(value: ast.AST, info: ModuleInfo) -> bool:
    """Does ``value`` evaluate to compiled kernels (or one kernel / extension function)?"""
    return kernel_value(value, info) is KernelValue.HANDLE


def _own_returns(fn: ast.AST) -> Iterator[ast.Return]:
    """``return`` statements of ``fn`` itself (not of functions or classes nested in it)."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return):
            yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def _neutral(value: ast.AST) -> bool:
    """``None`` and empty containers: placeholders before kernels are stored (``_K = None``,
    ``self._k = {}``), which neither make nor unmake a kernel binding."""
    if isinstance(value, ast.Constant):
        return value.value is None
    if isinstance(value, (ast.Dict, ast.List, ast.Tuple, ast.Set)):
        return not (value.keys if isinstance(value, ast.Dict) else value.elts)
    return (isinstance(value, ast.Call) and _dotted(value.func) in {"dict", "list"}
            and not value.args and not value.keywords)


def _returns_kernels(fn: ast.AST, info: ModuleInfo) -> bool:
    """Every value ``fn`` returns is kernels (``None`` aside), and it returns some: a helper
    that returns kernels on one path and a torch function on another is not a factory."""
    values = [r.value for r in _own_returns(fn) if r.value is not None and not _neutral(r.value)]
    return bool(values) and all(_holds_kernels(v, info) for v in values)


def _is_property(fn: ast.AST) -> bool:
    return any(_dotted(d) in {"property", "functools.cached_property", "cached_property"}
               for d in getattr(fn, "decorator_list", ()))


def _bind_kernels(info: ModuleInfo) -> None:
    """Names, self/class attributes, functions and methods that hold or return kernels.

    A fixed point over every way a module binds kernels (``k = _build(); self.k = k``, chains
    of helpers, ``@functools.cache`` builders, properties, class attributes), then names and
    attributes that are ever bound to anything else (``None``/empty placeholders aside) are
    excluded and the fixed point recomputed: ``k = kernels`` in one place and
    ``k = self._torch_helper`` in another must not turn the helper's call into a "launch".
    """
    banned_names: set[str] = set()
    banned_attrs: set[str] = set()
    while True:
        for bindings in (info.kernel_holders, info.kernel_factories, info.self_holders,
                         info.self_factories):
            bindings.clear()
        _bind_kernels_once(info, banned_names, banned_attrs)
        names, attrs = _rebound(info)
        if names <= banned_names and attrs <= banned_attrs:
            return
        banned_names |= names
        banned_attrs |= attrs


def _rebound(info: ModuleInfo) -> tuple[set[str], set[str]]:
    """Kernel names/self attributes that some assignment binds to something else."""
    names, attrs = set(), set()
    for target, value in _assignments(info.tree):
        while isinstance(target, ast.Subscript):
            target = target.value
        if _neutral(value) or kernel_value(value, info) is not None:
            continue
        if isinstance(target, ast.Name) and (target.id in info.kernel_holders
                                             or target.id in info.kernel_factories):
            names.add(target.id)
        attr = _self_attr(target)
        if attr is not None and (attr in info.self_holders or attr in info.self_factories):
            attrs.add(attr)
    return names, attrs


def _bind_kernels_once(info: ModuleInfo, banned_names: set[str], banned_attrs: set[str]) -> None:
    classes = [info.model_new] if info.model_new is not None else []
    for _ in range(10):
        size = (len(info.kernel_holders), len(info.kernel_factories), len(info.self_holders),
                len(info.self_factories))
        for name, fn in info.functions.items():
            if name not in banned_names and _returns_kernels(fn, info):
                info.kernel_factories.add(name)
        _bind_constructor_parameters(info, banned_names)
        for target, value in _assignments(info.tree):
            while isinstance(target, ast.Subscript):  # ``_KERNELS[shape] = compile_kernels(...)``
                target = target.value
            kind = kernel_value(value, info)
            if kind is None:
                continue
            attr = _self_attr(target)
            if isinstance(target, ast.Name) and target.id not in banned_names:
                (info.kernel_holders if kind is KernelValue.HANDLE
                 else info.kernel_factories).add(target.id)
            elif attr is not None and attr not in banned_attrs:
                (info.self_holders if kind is KernelValue.HANDLE
                 else info.self_factories).add(attr)
        for cls in classes:
            for node in cls.body:  # class attributes are read back as ``self.X``
                if isinstance(node, ast.Assign) and _holds_kernels(node.value, info):
                    info.self_holders.update(t.id for t in node.targets
                                             if isinstance(t, ast.Name) and t.id not in banned_attrs)
            for name, method in info.methods(cls).items():
                if name not in banned_attrs and _returns_kernels(method, info):
                    (info.self_holders if _is_property(method) else info.self_factories).add(name)
        if size == (len(info.kernel_holders), len(info.kernel_factories), len(info.self_holders),
                    len(info.self_factories)):
            return


def _bind_constructor_parameters(info: ModuleInfo, banned_names: set[str]) -> None:
    """A candidate class built with kernels (``Launcher(kernels.relu)``): the ``__init__``
    parameter that receives them holds kernels, so ``self.kernel = kernel`` and a later
    ``self.kernel(grid=...)`` are a kernel binding and a launch (a small wrapper class is a
    common, honest way to keep a kernel with its launch geometry). Only when every
    construction passes kernels there: ``Launcher(torch.relu)`` elsewhere unmakes it."""
    verdicts: dict[str, bool] = {}
    for call in ast.walk(info.tree):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                and call.func.id in info.classes):
            continue
        init = info.methods(info.classes[call.func.id]).get("__init__")
        if init is None:
            continue
        params = _params(init)[1:]  # after self
        passed = [(params[i], arg) for i, arg in enumerate(call.args) if i < len(params)]
        passed += [(kw.arg, kw.value) for kw in call.keywords if kw.arg in params]
        for name, value in passed:
            verdicts[name] = verdicts.get(name, True) and _holds_kernels(value, info)
    info.kernel_holders.update(name for name, all_kernels in verdicts.items()
                               if all_kernels and name not in banned_names)


def _classify_self_attrs(info: ModuleInfo) -> None:
    """Find self attributes holding kernels, tensors, torch modules and torch callables."""
    if info.model_new is None:
        return
    nn_module_names = ("torch.nn.", "torch.ao.nn.")
    for target, value in _assignments(info.model_new):
        while isinstance(target, ast.Subscript):  # ``self._kernels[key] = compile_kernels(...)``
            target = target.value
        attr = _self_attr(target)
        if attr is None:
            continue
        callee = resolve(value.func, info.aliases) if isinstance(value, ast.Call) else None
        if attr in info.self_holders or attr in info.self_factories:
            continue
        if callee in {"torch.nn.Parameter", "torch.nn.parameter.Parameter"} or (
            callee is not None and callee.startswith("torch.") and callee.count(".") == 1
        ):
            info.self_tensors.add(attr)
        elif callee is not None and callee.startswith(nn_module_names) or callee in info.classes:
            info.self_modules[attr] = callee
        else:
            dotted = resolve(value, info.aliases)
            if dotted and dotted.startswith("torch."):
                info.self_callables[attr] = dotted
    for node in ast.walk(info.model_new):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"register_buffer", "register_parameter"} and node.args
                and isinstance(node.args[0], ast.Constant)):
            info.self_tensors.add(str(node.args[0].value))


@functools.lru_cache(maxsize=64)
def _analyse_cached(source: str) -> ModuleInfo:
    return analyse(pyast.parse(source))


def analyse(tree: ast.Module) -> ModuleInfo:
    aliases = import_aliases(tree)
    functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    info = ModuleInfo(
        tree=tree, aliases=aliases, functions=functions, classes=classes,
        model_new=classes.get("ModelNew"),
    )
    _bind_kernels(info)
    _classify_self_attrs(info)
    return info


# ---------------------------------------------------------------------------------------------
# Reachability from ModelNew.forward, with tensor tracking
# ---------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class FunctionScope:
    """One function reachable from forward, with the names that hold tensors in it."""

    fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
    tensors: set[str]
    aliases_of_inputs: set[str] = field(default_factory=set)  # forward only


def _params(fn: ast.AST) -> list[str]:
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args)]
    return names


def is_tensor_expr(node: ast.AST, tensors: set[str], info: ModuleInfo) -> bool:
    """Heuristic: does ``node`` evaluate to a tensor (so operators on it are torch compute)?"""
    if isinstance(node, ast.Name):
        return node.id in tensors
    if isinstance(node, ast.Starred):
        return is_tensor_expr(node.value, tensors, info)
    if isinstance(node, ast.Attribute):
        attr = _self_attr(node)
        if attr is not None:
            return attr in info.self_tensors
        if isinstance(node.value, ast.Attribute) and _self_attr(node.value) in info.self_modules:
            return node.attr in {"weight", "bias"}
        if node.attr in TENSOR_ATTRIBUTES:
            return is_tensor_expr(node.value, tensors, info)
        return False
    if isinstance(node, ast.Subscript):
        return is_tensor_expr(node.value, tensors, info)
    if isinstance(node, ast.BinOp):
        return is_tensor_expr(node.left, tensors, info) or is_tensor_expr(node.right, tensors, info)
    if isinstance(node, ast.UnaryOp):
        return is_tensor_expr(node.operand, tensors, info)
    if isinstance(node, ast.IfExp):
        return is_tensor_expr(node.body, tensors, info) or is_tensor_expr(node.orelse, tensors, info)
    if isinstance(node, (ast.Tuple, ast.List)):
        return any(is_tensor_expr(e, tensors, info) for e in node.elts)
    if isinstance(node, ast.Call):
        return _call_returns_tensor(node, tensors, info)
    return False


def _call_returns_tensor(node: ast.Call, tensors: set[str], info: ModuleInfo) -> bool:
    func = node.func
    name = resolve(func, info.aliases)
    if name and name.startswith("torch."):
        return name not in NON_TENSOR_TORCH_FUNCTIONS
    if isinstance(func, ast.Attribute) and is_tensor_expr(func.value, tensors, info):
        return func.attr not in QUERY_METHODS
    if _holds_kernels(func, info):  # load_inline extension functions return tensors
        return True
    attr = _self_attr(func)
    return attr is not None and (attr in info.self_modules or attr in info.self_callables)


def _bind_tensors(fn: ast.AST, seeds: set[str], info: ModuleInfo) -> set[str]:
    """Names holding tensors in ``fn``: seeds plus names assigned from tensor expressions."""
    tensors = set(seeds)
    for _ in range(4):
        before = len(tensors)
        for target, value in _assignments(fn):
            if isinstance(target, ast.Name) and is_tensor_expr(value, tensors, info):
                tensors.add(target.id)
        for node in ast.walk(fn):
            if isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name):
                if is_tensor_expr(node.iter, tensors, info):
                    tensors.add(node.target.id)
            if isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name):
                if is_tensor_expr(node.context_expr, tensors, info):
                    tensors.add(node.optional_vars.id)
        if len(tensors) == before:
            break
    return tensors


def _call_target(call: ast.Call, info: ModuleInfo) -> tuple[ast.AST | None, bool]:
    """The module-local function a call runs (and whether it is a bound method), if any."""
    func = call.func
    if isinstance(func, ast.Name):
        if func.id in info.functions:
            return info.functions[func.id], False
        if func.id in info.classes:
            return info.methods(info.classes[func.id]).get("__init__"), True
        return None, False
    if not isinstance(func, ast.Attribute):
        return None, False
    if isinstance(func.value, ast.Name) and func.value.id == "self" and info.model_new:
        method = info.methods(info.model_new).get(func.attr)
        if method is not None:
            return method, True
        local_cls = info.self_modules.get(func.attr)
        if local_cls in info.classes:  # ``self.helper(x)`` on a module-local class instance
            methods = info.methods(info.classes[local_cls])
            return methods.get("forward") or methods.get("__call__"), True
        return None, False
    owner = _self_attr(func.value)
    if owner in info.self_modules and info.self_modules[owner] in info.classes:
        return info.methods(info.classes[info.self_modules[owner]]).get(func.attr), True
    if isinstance(func.value, ast.Name) and func.value.id in info.classes:
        method = info.methods(info.classes[func.value.id]).get(func.attr)
        is_static = method is not None and any(
            _dotted(d) == "staticmethod" for d in method.decorator_list
        )
        return method, not is_static
    return None, False


def reachable_scopes(info: ModuleInfo) -> list[FunctionScope]:
    """forward and every module-local function/method it calls, transitively.

    Parameters of a helper are tensors when the call site passes a tensor in that position, so
    ``self._grid(n)`` with an int ``n`` does not make ``n + 255`` look like compute.
    """
    if info.scopes is None:
        info.scopes = _reachable_scopes(info)
    return info.scopes


# nn.Module methods the harness's ``model(*inputs)`` runs instead of (or around) forward.
CALL_ENTRY_POINTS = ("forward", "__call__", "_call_impl", "_wrapped_call_impl", "__getattr__",
                     "__getattribute__")


def _entry_points(info: ModuleInfo) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """forward first, then overrides of the call path and properties (code that runs when the
    harness calls or touches the model)."""
    assert info.model_new is not None
    methods = info.methods(info.model_new)
    entries = [methods[name] for name in CALL_ENTRY_POINTS if name in methods]
    entries += [m for m in methods.values() if m not in entries and any(
        _dotted(d) in {"property", "functools.cached_property", "cached_property"}
        for d in m.decorator_list)]
    return entries


def _entry_seeds(fn: ast.AST) -> set[str]:
    """Parameters but ``self`` of the call path hold the inputs; properties and __getattr__
    take no tensors."""
    if fn.name not in CALL_ENTRY_POINTS[:4]:
        return set()
    seeds = set(_params(fn)[1:]) | {a.arg for a in (fn.args.vararg, fn.args.kwarg) if a}
    return seeds | {a.arg for a in fn.args.kwonlyargs}


def _reachable_scopes(info: ModuleInfo) -> list[FunctionScope]:
    forward = info.forward
    if forward is None:
        return []
    params = _params(forward)[1:]
    scopes: list[FunctionScope] = []
    seen: set[tuple[int, frozenset[str]]] = set()
    work = [(fn, _entry_seeds(fn)) for fn in reversed(_entry_points(info))]  # forward first
    while work:
        fn, fn_seeds = work.pop()
        key = (id(fn), frozenset(fn_seeds))
        if key in seen or len(seen) > 200:
            continue
        seen.add(key)
        tensors = _bind_tensors(fn, fn_seeds, info)
        scopes.append(FunctionScope(fn=fn, tensors=tensors))
        called = {id(n.func) for n in ast.walk(fn) if isinstance(n, ast.Call)}
        for node in ast.walk(fn):
            if isinstance(node, ast.Call):
                target, bound = _call_target(node, info)
                if target is not None:
                    work.append((target, _tensor_params(node, target, bound, tensors, info)))
            elif id(node) not in called:
                target = _function_value(node, info)
                if target is not None:  # passed or stored, called later: every parameter
                    work.append((target, _all_params(target)))  # may be a tensor
        for deco in getattr(fn, "decorator_list", ()):  # the wrapper it returns runs instead
            target = _function_value(deco.func if isinstance(deco, ast.Call) else deco, info)
            if target is not None:
                work.append((target, _all_params(target)))
    scopes[0].aliases_of_inputs = _input_aliases(forward, set(params), info)
    return scopes


def _function_value(node: ast.AST, info: ModuleInfo) -> ast.AST | None:
    """A module-local function or ModelNew method used as a value (``f = self._helper``,
    ``partial(_post, y)``, ``k = _scale``): it may run later with anything."""
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        return info.functions.get(node.id)
    if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
            and _self_attr(node) is not None and info.model_new is not None):
        return info.methods(info.model_new).get(node.attr)
    return None


def _all_params(fn: ast.AST) -> set[str]:
    """Parameters of ``fn`` and of the functions and lambdas nested in it (a function used as
    a value or a decorator may return a wrapper that runs with the inputs)."""
    names: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            names |= {p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)}
            names |= {p.arg for p in (a.vararg, a.kwarg) if p}
    return names - {"self", "cls"}


def _tensor_params(call: ast.Call, target: ast.AST, bound: bool, tensors: set[str],
                   info: ModuleInfo) -> set[str]:
    names = _params(target)[1:] if bound else _params(target)
    out = {name for name, arg in zip(names, call.args) if is_tensor_expr(arg, tensors, info)}
    out |= {kw.arg for kw in call.keywords if kw.arg and is_tensor_expr(kw.value, tensors, info)}
    if target.args.vararg and any(is_tensor_expr(a, tensors, info) for a in call.args[len(names):]):
        out.add(target.args.vararg.arg)
    return out


def _input_aliases(forward: ast.AST, params: set[str], info: ModuleInfo) -> set[str]:
    """Names in forward that are always the inputs themselves or views of them (never copies).

    Flow-insensitive and conservative: a name assigned anything but a view of an input at any
    point is not an alias, so ``x = torch.empty_like(x)`` clears ``x``.
    """
    assigned: dict[str, list[ast.AST]] = {}
    for target, value in _assignments(forward):
        if isinstance(target, ast.Name):
            assigned.setdefault(target.id, []).append(value)
    aliases = {p for p in params if p not in assigned}
    for _ in range(4):
        grown = {
            name for name, values in assigned.items()
            if all(_is_view_of(v, aliases | params, info.aliases) for v in values)
        }
        if grown <= aliases:
            break
        aliases |= grown
    return aliases


def _is_view_of(node: ast.AST, aliases: set[str], imports: dict[str, str] | None = None
                ) -> bool:
    """Whether ``node`` may be one of ``aliases`` or share its storage: a view, an indexing,
    ``.T``/``.data``, or a conversion that returns the tensor itself when there is nothing to
    convert. ``imports`` (import aliases) resolves ``torch.reshape(x)``-style calls."""
    if isinstance(node, ast.Name):
        return node.id in aliases
    if isinstance(node, ast.Subscript):
        return _is_view_of(node.value, aliases, imports)
    if isinstance(node, ast.Attribute) and node.attr in ALIAS_ATTRIBUTES:
        return _is_view_of(node.value, aliases, imports)
    if isinstance(node, ast.Call):
        function = resolve(node.func, imports) if imports is not None else None
        if function is not None and function.startswith("torch."):  # torch.reshape(x, ...)
            return (function in ALIAS_TORCH_FUNCTIONS and bool(node.args)
                    and _is_view_of(node.args[0], aliases, imports))
        if isinstance(node.func, ast.Attribute) and node.func.attr in ALIAS_METHODS:
            return _is_view_of(node.func.value, aliases, imports)
    return False


def _walk_scopes(info: ModuleInfo) -> Iterator[tuple[FunctionScope, ast.AST]]:
    for scope in reachable_scopes(info):
        for node in ast.walk(scope.fn):
            yield scope, node


# ---------------------------------------------------------------------------------------------
# The checks: one per hack pattern
# ---------------------------------------------------------------------------------------------


def check_syntax(tree: ast.Module, source: str) -> list[Finding]:
    """The candidate must compile as Python.

    Rationale: a broken candidate must fail cleanly with the line, not crash the worker; some
    errors (``return`` outside a function, bad ``nonlocal``) only appear at compile time, after
    ``ast.parse`` succeeded.
    """
    try:
        compile(source, "<candidate>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        return [Finding(rule="syntax", reason=RejectReason.SYNTAX, line=exc.lineno,
                        message=f"not valid Python: {exc.msg}")]
    return []


def check_model_new(tree: ast.Module, source: str) -> list[Finding]:
    """A top-level ``class ModelNew`` with a ``forward`` method must exist.

    Rationale: the evaluator instantiates ``ModelNew``; ``ModelNew = Model`` or a missing class
    must be refused with a clear message rather than an AttributeError inside the worker.
    """
    info = _analyse_cached(source)
    if info.model_new is None:
        return [_finding("model_new_class", RejectReason.NO_MODEL_NEW,
                         "define `class ModelNew(nn.Module)` at module level with the "
                         "reference Model's __init__ and forward signature", None)]
    if info.forward is None:
        return [_finding("model_new_forward", RejectReason.NO_MODEL_NEW,
                         "ModelNew has no forward method", info.model_new)]
    return []


def check_kernel_defined_and_launched(tree: ast.Module, source: str) -> list[Finding]:
    """At least one kernel is defined and ModelNew.forward (or a helper it calls) launches one.

    Rationale: KernelBench's "torch fallback" — candidates that define a CUDA string but never
    call it, or define none at all, and let PyTorch compute the answer.
    """
    info = _analyse_cached(source)
    defines = any(_is_builder_call(n, info.aliases) for n in ast.walk(tree)) or any(
        isinstance(n, ast.Constant) and isinstance(n.value, str) and "__global__" in n.value
        for n in ast.walk(tree)
    )
    if not defines:
        return [_finding("kernel_defined", RejectReason.NO_KERNEL,
                         "no CUDA kernel defined: compile one with "
                         "multiminddev.cuda.compile_kernels(...) (or load_inline)", None)]
    if info.forward is None:
        return []
    for _, node in _walk_scopes(info):
        if isinstance(node, ast.Call) and _is_launch(node, info):
            return []
    return [_finding("kernel_launched", RejectReason.NO_KERNEL,
                     "ModelNew.forward never launches one of your kernels (call e.g. "
                     "kernels.<name>(grid=..., block=..., args=...))", info.forward)]


def _is_launch(call: ast.Call, info: ModuleInfo) -> bool:
    """Calling a kernel handle (``kernels.relu(...)``, ``_kernels().relu(...)``, ``ext.f(x)``)."""
    return not _is_builder_call(call, info.aliases) and _holds_kernels(call.func, info)


def check_torch_compute(tree: ast.Module, source: str) -> list[Finding]:
    """No torch compute in ModelNew.forward or the module-local helpers it calls.

    Rationale: KernelBench/Kevin/CUDA-L1 "torch fallback" hacks — ``torch.matmul``, ``F.relu``,
    ``x @ w``, ``x.sum()``, ``self.linear(x)`` do the work while a token kernel runs; also
    compute hidden in a helper method. Allocation, views, shape queries and stream queries are
    allowed; arithmetic on ints and shapes is fine.
    """
    info = _analyse_cached(source)
    findings: list[Finding] = []
    for scope, node in _walk_scopes(info):
        message = _compute_message(node, scope.tensors, info)
        if message:
            findings.append(_finding("torch_compute", RejectReason.TORCH_COMPUTE,
                                     f"{message} in forward; do the computation in your kernel",
                                     node))
    return _dedup(findings)


def _compute_message(node: ast.AST, tensors: set[str], info: ModuleInfo) -> str | None:
    if isinstance(node, ast.Call):
        return _call_compute_message(node, tensors, info)
    if isinstance(node, ast.BinOp) and is_tensor_expr(node, tensors, info):
        return f"tensor arithmetic `{ast.unparse(node)[:60]}`"
    if isinstance(node, ast.UnaryOp) and not isinstance(node.op, ast.Not) and is_tensor_expr(
            node.operand, tensors, info):
        return f"tensor arithmetic `{ast.unparse(node)[:60]}`"
    if isinstance(node, ast.AugAssign) and is_tensor_expr(node.target, tensors, info):
        return f"in-place tensor arithmetic `{ast.unparse(node)[:60]}`"
    if isinstance(node, ast.Compare) and not all(
            isinstance(op, (ast.Is, ast.IsNot, ast.In, ast.NotIn)) for op in node.ops):
        if any(is_tensor_expr(x, tensors, info) for x in (node.left, *node.comparators)):
            return f"tensor comparison `{ast.unparse(node)[:60]}`"
    if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Subscript) and is_tensor_expr(t.value, tensors, info)
            for t in node.targets):
        return f"tensor item assignment `{ast.unparse(node)[:60]}`"
    return None


def _held_by_own_instance(func: ast.Attribute, info: ModuleInfo) -> str | None:
    """``self.helper.act(x)`` where ``helper`` is an instance of the candidate's own class and
    ``act`` is not one of its methods but a value it stores: a call of that value is a launch
    only when every value the class stores there is a kernel (``nn.ReLU()`` held by a helper
    is torch compute, however the call is spelled)."""
    cls = info.classes[info.self_modules[_self_attr(func.value)]]
    if func.attr in info.methods(cls) or _own_instance_holds_kernel(func, info):
        return None
    return (f"`{ast.unparse(func)}` (not a kernel: {cls.name}.{func.attr} holds other values, "
            f"or self.{_self_attr(func.value)} is bound to other objects)")


def _own_instance_holds_kernel(node: ast.Attribute, info: ModuleInfo) -> bool:
    """``self.launcher.kernel``: ``launcher`` is only ever bound to instances of one class of
    the candidate's own, and every value that class stores in ``self.kernel`` is a kernel."""
    owner = _self_attr(node.value)
    cls = info.classes.get(info.self_modules.get(owner, "")) if owner is not None else None
    if cls is None or info.model_new is None:
        return False
    bound = [value for target, value in _assignments(info.model_new) if _self_attr(target) == owner]
    if not all(isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == cls.name
               for v in bound):
        return False
    stored = [value for target, value in _assignments(cls) if _self_attr(target) == node.attr]
    return bool(stored) and all(_neutral(v) or kernel_value(v, info) is KernelValue.HANDLE
                                for v in stored) and not all(_neutral(v) for v in stored)


def _call_compute_message(node: ast.Call, tensors: set[str], info: ModuleInfo) -> str | None:
    func = node.func
    name = resolve(func, info.aliases)
    if name and (name == "torch" or name.startswith("torch.")):
        if name in ALLOWED_TORCH_FUNCTIONS or name in CONCURRENCY_TORCH or name.startswith(
                "torch.utils.cpp_extension."):
            return None  # allowed, or reported by check_concurrency / check_file_access
        if name.startswith("torch.Tensor.") and name.rsplit(".", 1)[1] in VIEW_METHODS | QUERY_METHODS:
            return None
        return f"torch call `{name}`"
    if isinstance(func, ast.Attribute) and is_tensor_expr(func.value, tensors, info):
        if func.attr not in VIEW_METHODS | QUERY_METHODS | LOW_PRECISION_METHODS:
            return f"tensor method `.{func.attr}()`"
        return None
    attr = _self_attr(func)
    if attr in info.self_modules and info.self_modules[attr] not in info.classes:
        return f"torch module call `self.{attr}(...)` ({info.self_modules[attr]})"
    if attr in info.self_callables:
        return f"torch call `self.{attr}` ({info.self_callables[attr]})"
    if isinstance(func, ast.Attribute) and _self_attr(func.value) in info.self_modules:
        if info.self_modules[_self_attr(func.value)] not in info.classes:
            return f"torch module method `{ast.unparse(func)}(...)`"
        held = _held_by_own_instance(func, info)
        if held is not None:
            return held
    if _is_launch(node, info) or _call_target(node, info)[0] is not None:
        return None
    args = [*node.args, *(kw.value for kw in node.keywords)]
    if not any(is_tensor_expr(a, tensors, info) for a in args):
        return None
    if isinstance(func, ast.Name) and func.id in HARMLESS_BUILTINS | {"id", "hash"}:
        return None
    if isinstance(func, ast.Name) and func.id in info.kernel_holders:
        return None
    if isinstance(func, ast.Attribute) and _self_attr(func) is None:
        root = _root(func)
        if (isinstance(root, ast.Name) and root.id not in info.aliases
                and root.id not in BUILTIN_NAMES and root.id not in tensors):
            return None  # a method of a local object (``outs.append(y)``), not compute
    return f"`{ast.unparse(func)[:40]}` applied to tensors"


def check_reference_use(tree: ast.Module, source: str) -> list[Finding]:
    """No use of the reference ``Model``: no inheriting, instantiating, importing or calling it.

    Rationale: KernelBench and Sakana archive hacks — ``class ModelNew(Model)`` inherits the
    reference forward; ``self.ref = Model(...)`` calls it; ``from <problem> import Model``.
    """
    info = _analyse_cached(source)
    findings = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "Model" and isinstance(node.ctx, ast.Load):
            findings.append(_finding("reference_model", RejectReason.REFERENCE_USE,
                                     "uses the reference `Model`; ModelNew must compute with "
                                     "its own kernels", node))
        elif isinstance(node, ast.Attribute) and node.attr == "Model":
            findings.append(_finding("reference_model", RejectReason.REFERENCE_USE,
                                     f"uses the reference `{ast.unparse(node)}`", node))
        elif isinstance(node, ast.ImportFrom) and any(a.name == "Model" for a in node.names):
            findings.append(_finding("reference_import", RejectReason.REFERENCE_USE,
                                     f"imports the reference Model from {node.module!r}", node))
    if info.model_new is not None:
        bound = _names_bound_anywhere(tree)
        for base in info.model_new.bases:
            name = resolve(base, info.aliases)
            root = (_dotted(base) or "").split(".")[0]
            if root and root not in bound and root not in dir(builtins):
                # e.g. `nn.Module` without importing nn: the import fails with a NameError,
                # reported as the error it is rather than counted as a reward hack.
                continue
            if name not in {"torch.nn.Module", "torch.nn.modules.module.Module"} and (
                    name not in info.classes):
                findings.append(_finding("reference_inheritance", RejectReason.REFERENCE_USE,
                                         f"ModelNew must subclass nn.Module, not {name}", base))
    return _dedup(findings)


def _names_bound_anywhere(tree: ast.Module) -> set[str]:
    """Every name the module binds in any scope (imports, assignments, defs, classes, loop and
    with targets): deliberately generous, so only a name bound nowhere counts as unbound."""
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return bound


def check_try_except_fallback(tree: ast.Module, source: str) -> list[Finding]:
    """No try/except in forward (or its helpers) or around kernel compilation/launch.

    Rationale: "try the kernel, fall back to torch on error" — the kernel fails (or is never
    meant to work) and torch silently produces the answer; also ``contextlib.suppress``.
    """
    info = _analyse_cached(source)
    findings = []
    for _, node in _walk_scopes(info):
        if isinstance(node, (ast.Try, ast.TryStar)):
            findings.append(_finding("try_in_forward", RejectReason.TRY_EXCEPT_FALLBACK,
                                     "try/except in forward: errors must surface, not fall back",
                                     node))
        elif isinstance(node, ast.withitem) and "suppress" in (ast.unparse(node.context_expr)):
            findings.append(_finding("suppress_in_forward", RejectReason.TRY_EXCEPT_FALLBACK,
                                     "contextlib.suppress in forward hides kernel failures",
                                     node.context_expr))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Try, ast.TryStar)) and any(
                isinstance(n, ast.Call) and (_is_builder_call(n, info.aliases) or _is_launch(n, info))
                for stmt in node.body for n in ast.walk(stmt)):
            findings.append(_finding("try_around_kernel", RejectReason.TRY_EXCEPT_FALLBACK,
                                     "try/except around kernel compilation or launch: a failing "
                                     "kernel must fail the candidate", node))
    return _dedup(findings)


FINALIZER_METHODS = frozenset({"__del__"})


def check_finalizers(tree: ast.Module, source: str) -> list[Finding]:
    """No finalizer (``__del__``) on the candidate's classes, defined or assigned.

    Rationale: a finalizer runs when an object is collected, at the latest when the worker
    exits, after its evaluation has ended: a kernel launched there runs beside the next
    evaluation's timing on the GPU, where no check of this candidate sees it."""
    findings = []
    for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
        for item in cls.body:
            names = ([item.name] if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                     else [t.id for t in getattr(item, "targets", [getattr(item, "target", None)])
                           if isinstance(t, ast.Name)])
            for name in names:
                if name in FINALIZER_METHODS:
                    findings.append(_finding(
                        "finalizer", RejectReason.CONCURRENCY,
                        (f"`{name}` runs code after the evaluation has ended (when the object "
                         "is collected or the worker exits); do all the work in forward"), item))
    return findings


def check_concurrency(tree: ast.Module, source: str) -> list[Finding]:
    """No threads, processes, async tasks, side streams, events or CUDA graphs.

    Rationale: GPU MODE / CUDA-L1 hacks — work launched on a side stream the timing events do
    not see; threads that finish the output after forward returned; graph replays that skip
    work. The timer only measures work ordered on the current stream.
    """
    info = _analyse_cached(source)
    findings = []
    for node in ast.walk(tree):
        for module in _imported_modules(node):
            if module in CONCURRENCY_MODULES or module.split(".")[0] in CONCURRENCY_MODULES:
                findings.append(_finding("concurrency_import", RejectReason.CONCURRENCY,
                                         f"imports {module}: no threads or processes", node))
        if isinstance(node, (ast.Attribute, ast.Name)):
            name = resolve(node, info.aliases)
            if name in CONCURRENCY_TORCH or (name and name.split(".")[0] in CONCURRENCY_MODULES
                                             and isinstance(node, ast.Attribute)):
                findings.append(_finding("streams_events_graphs", RejectReason.CONCURRENCY,
                                         f"uses {name}: launch on the current stream only", node))
        if isinstance(node, (ast.AsyncFunctionDef, ast.Await)):
            findings.append(_finding("async", RejectReason.CONCURRENCY,
                                     "async code in a candidate", node))
    return _dedup(findings)


def _imported_modules(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        module = node.module or ""
        return [f"{module}.{a.name}" if module else a.name for a in node.names] + [module]
    return []


def check_monkey_patch(tree: ast.Module, source: str) -> list[Finding]:
    """No assignments to attributes or items of imported modules/classes, no setattr on them.

    Rationale: timer hacks that replace ``torch.cuda.Event.elapsed_time`` or
    ``time.perf_counter``; patching ``torch.allclose`` or the harness so comparisons pass;
    flipping ``torch.backends`` flags. Also tensor subclasses with ``__torch_function__`` /
    ``__torch_dispatch__`` (lazy tensors that compute, or fake equality, at comparison time).
    """
    info = _analyse_cached(source)
    findings = []
    for node in ast.walk(tree):
        for target in _assignment_targets(node):
            message = _patch_target_message(target, info)
            if message:
                findings.append(_finding("patch_module", RejectReason.MONKEY_PATCH, message, node))
        if isinstance(node, ast.Call) and _dotted(node.func) in SETATTR_FUNCTIONS:
            if not (node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "self"):
                findings.append(_finding("setattr", RejectReason.MONKEY_PATCH,
                                         "setattr/delattr on something other than self", node))
        if isinstance(node, ast.Call):
            name = resolve(node.func, info.aliases) or ""
            if name.startswith(TORCH_STATE_SETTERS) and name not in TORCH_STATE_SETTERS_OK:
                findings.append(_finding("torch_global_state", RejectReason.MONKEY_PATCH,
                                         f"{name}() changes torch's global numerics/state",
                                         node))
        findings.extend(_tensor_subclass_findings(node, info))
    return _dedup(findings)


def _assignment_targets(node: ast.AST) -> list[ast.AST]:
    """Every target ``node`` stores into or deletes: assignments, loop, ``with`` and
    comprehension targets (``for torch.Tensor.zero_ in [f]`` assigns too), unpacked."""
    if isinstance(node, (ast.Assign, ast.Delete)):
        roots = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor, ast.comprehension)):
        roots = [node.target]
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        roots = [item.optional_vars for item in node.items if item.optional_vars is not None]
    else:
        return []
    out = []
    while roots:
        target = roots.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            roots.extend(target.elts)
        elif isinstance(target, ast.Starred):
            roots.append(target.value)
        else:
            out.append(target)
    return out


SETATTR_FUNCTIONS = frozenset({"setattr", "delattr", "object.__setattr__", "object.__delattr__",
                               "type.__setattr__", "type.__delattr__"})
TORCH_STATE_SETTERS = ("torch.set_", "torch.backends.", "torch.cuda.set_", "torch.use_deterministic",
                       "torch.cuda.matmul.")
TORCH_STATE_SETTERS_OK = frozenset({"torch.set_grad_enabled"})


def _patch_target_message(target: ast.AST, info: ModuleInfo) -> str | None:
    """Why assigning to ``target`` patches shared code (a module, a class), or None."""
    if not isinstance(target, (ast.Attribute, ast.Subscript)):
        return None
    root = _root(target)
    if isinstance(root, ast.Name) and (root.id in info.aliases or root.id == "__builtins__"):
        return (f"modifies {ast.unparse(target)[:60]} (imported from "
                f"{info.aliases.get(root.id, root.id)})")
    chain = ast.unparse(target)
    if isinstance(target, ast.Attribute) and isinstance(root, ast.Name) and (
            root.id in info.classes and target.value is root):
        return (f"modifies class {root.id} after its definition ({chain[:60]}); define its "
                "members in the class body")
    if _self_attr(target) in CALL_ENTRY_POINTS:
        return (f"rebinds {chain[:60]}: the harness calls the forward method you define, "
                "never a replacement")
    if "__class__" in chain or (isinstance(root, ast.Name) and root.id == "type"):
        return f"modifies a class through {chain[:60]}"
    if (isinstance(target, ast.Attribute) and target.attr.startswith("__")
            and target.attr.endswith("__") and not (isinstance(target.value, ast.Name)
                                                    and target.value.id in {"self", "cls"})):
        return f"replaces the special method {chain[:60]}"
    if isinstance(target, ast.Attribute) and not (isinstance(target.value, ast.Name)
                                                  and target.value.id in {"self", "cls"}):
        # Whatever the receiver is bound to (a list holding torch.Tensor, a loop variable, a
        # default argument), setting its attribute may patch a class the harness uses.
        return (f"sets {chain[:60]}: only attributes of self (or cls) may be set; keep other "
                "state in self's attributes")
    return None


def _tensor_subclass_findings(node: ast.AST, info: ModuleInfo) -> list[Finding]:
    if isinstance(node, ast.ClassDef):
        bases = {resolve(b, info.aliases) for b in node.bases}
        if bases & {"torch.Tensor", "torch._C.TensorBase", "torch._C._TensorBase"}:
            return [_finding("tensor_subclass", RejectReason.MONKEY_PATCH,
                             f"class {node.name} subclasses torch.Tensor; return plain tensors",
                             node)]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in {
            "__torch_function__", "__torch_dispatch__"}:
        return [_finding("tensor_subclass", RejectReason.MONKEY_PATCH,
                         f"defines {node.name}: overriding torch dispatch is not allowed", node)]
    if isinstance(node, ast.Attribute) and node.attr in {"_make_subclass", "_make_wrapper_subclass",
                                                         "as_subclass"}:
        return [_finding("tensor_subclass", RejectReason.MONKEY_PATCH,
                         f"{node.attr}: tensor subclasses are not allowed", node)]
    return []


def check_file_access(tree: ast.Module, source: str) -> list[Finding]:
    """No reading or writing files (``open``, pathlib, ``np.load``, ``torch.load``, pickle).

    Rationale: candidates that load precomputed outputs from disk, or rebuild from on-disk
    sources, instead of computing; the evaluator's own files are off limits.
    """
    info = _analyse_cached(source)
    findings = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = resolve(node.func, info.aliases)
        if name in FILE_FUNCTIONS or (name and name.startswith(("pickle.", "shelve.", "marshal."))):
            findings.append(_finding("file_access", RejectReason.FILE_ACCESS,
                                     f"calls {name}: candidates may not touch files", node))
        elif isinstance(node.func, ast.Attribute) and node.func.attr in FILE_METHODS - {"open"}:
            findings.append(_finding("file_access", RejectReason.FILE_ACCESS,
                                     f"calls .{node.func.attr}(): candidates may not touch files",
                                     node))
    return _dedup(findings)


def check_pointer_cache(tree: ast.Module, source: str) -> list[Finding]:
    """No caches keyed by data pointers, ``id()`` or tensors; no memoised forward.

    Rationale: caching outputs keyed by ``x.data_ptr()`` (or ``lru_cache`` on forward, which
    keys by identity) returns stale results when the harness reuses input buffers — and makes
    timed runs free. Caches keyed by shapes (e.g. a kernel per shape) are fine.
    """
    info = _analyse_cached(source)
    findings = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for deco in node.decorator_list:
                name = resolve(deco.func if isinstance(deco, ast.Call) else deco, info.aliases)
                params = [p for p in _params(node) if p not in {"self", "cls"}]
                if name in CACHE_DECORATORS and params:
                    findings.append(_finding("memoised_function", RejectReason.POINTER_CACHE,
                                             f"@{name} on {node.name}: results keyed by "
                                             "argument identity", deco))
    for scope, node in _walk_scopes(info):
        key = _cache_key(node)
        container = getattr(node, "value", None) if isinstance(node, ast.Subscript) else None
        if container is not None and is_tensor_expr(container, scope.tensors, info):
            continue  # indexing a tensor, not a cache
        if key is not None and (_is_pointer_key(key, scope, info) or is_tensor_expr(
                key, scope.tensors, info)):
            findings.append(_finding("pointer_cache", RejectReason.POINTER_CACHE,
                                     f"cache keyed by `{ast.unparse(key)[:50]}` (a pointer or "
                                     "tensor identity)", node))
    return _dedup(findings)


def _cache_key(node: ast.AST) -> ast.AST | None:
    if isinstance(node, ast.Subscript):
        return node.slice if isinstance(node.value, (ast.Attribute, ast.Name)) else None
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"get", "setdefault", "pop", "__getitem__", "__contains__"}
            and node.args):
        return node.args[0]
    if isinstance(node, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops):
        return node.left
    return None


def _is_pointer_key(key: ast.AST, scope: FunctionScope, info: ModuleInfo) -> bool:
    pointer_names = {
        t.id for t, v in _assignments(scope.fn)
        if isinstance(t, ast.Name) and _mentions_pointer(v)
    }
    return _mentions_pointer(key) or any(
        isinstance(n, ast.Name) and n.id in pointer_names for n in ast.walk(key))


def _mentions_pointer(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            if isinstance(n.func, ast.Attribute) and n.func.attr in {"data_ptr", "untyped_storage",
                                                                     "storage"}:
                return True
            if isinstance(n.func, ast.Name) and n.func.id in {"id", "hash"}:
                return True
    return False


# ---------------------------------------------------------------------------------------------
# The allowlist: what candidate Python may name at all (anywhere in the module)
# ---------------------------------------------------------------------------------------------

# Modules a candidate may import (``import m``, ``import m as a``, ``from p import m``). Each is
# a namespace only: its attributes are reachable solely through the names in ALLOWED_NAMES, and
# the module object itself never appears as a value. torch.nn.functional may be imported (model
# code imports it by habit) but names nothing: its functions are torch compute.
IMPORTABLE_MODULES = frozenset(
    {"torch", "torch.nn", "torch.nn.functional", "torch.nn.init", "torch.utils.cpp_extension",
     "math", "typing",
     "__future__", "multiminddev.cuda", "functools", "itertools", "collections",
     "collections.abc", "dataclasses", "enum"}
)
_DTYPES = (
    "float32", "float", "float64", "double", "float16", "half", "bfloat16", "complex64",
    "complex128", "cfloat", "cdouble", "int8", "int16", "short", "int32", "int", "int64", "long",
    "uint8", "uint16", "uint32", "uint64", "bool", "float8_e4m3fn", "float8_e5m2",
)
# nn layer classes: constructing one in __init__ mirrors the reference's parameter creation
# (same seed, same weights); calling one in forward is torch compute (check_torch_compute).
_NN_CLASSES = (
    "Module", "Parameter", "ParameterList", "ParameterDict", "ModuleList", "ModuleDict",
    "Sequential", "Identity", "Linear", "Bilinear", "Conv1d", "Conv2d", "Conv3d",
    "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d", "LayerNorm", "GroupNorm", "RMSNorm",
    "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm1d", "InstanceNorm2d",
    "InstanceNorm3d", "LocalResponseNorm", "Embedding", "EmbeddingBag", "Dropout", "Dropout1d",
    "Dropout2d", "Dropout3d", "ReLU", "ReLU6", "GELU", "SiLU", "Mish", "Sigmoid", "Tanh",
    "Softmax", "LogSoftmax", "Softmin", "LeakyReLU", "ELU", "SELU", "CELU", "PReLU", "GLU",
    "Hardtanh", "Hardswish", "Hardsigmoid", "Hardshrink", "Softshrink", "Tanhshrink",
    "Softplus", "Softsign", "LogSigmoid", "Threshold", "MaxPool1d", "MaxPool2d", "MaxPool3d",
    "AvgPool1d", "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d",
    "Flatten", "Unflatten", "Upsample", "PixelShuffle", "PixelUnshuffle", "MultiheadAttention",
    "LSTM", "GRU", "RNN",
)
_NN_INIT = (
    "uniform_", "normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_", "xavier_uniform_",
    "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "trunc_normal_", "orthogonal_",
    "calculate_gain",
    # private, but nn.Linear's own reset_parameters uses it; candidates copy that code
    "_calculate_fan_in_and_fan_out",
)
# Every torch name a candidate may reference, in any position: allocation and parameter
# creation, views and shape helpers, dtype/device/shape objects, grad-mode context managers,
# read-only device queries, nn layer classes and init, load_inline. Compute functions are not
# here; neither is anything that reaches the dispatcher, the RNG state, streams and events,
# autograd, compilation, files, or torch's private modules.
TORCH_NAMES = frozenset(
    {
        *(f"torch.{n}" for n in _DTYPES),
        *(f"torch.{n}" for n in (
            "Tensor", "Size", "device", "dtype", "finfo", "iinfo", "layout", "memory_format",
            "strided", "contiguous_format", "channels_last", "channels_last_3d",
            "preserve_format", "tensor", "arange", "linspace", "eye", "randn", "rand", "randint",
            "randn_like", "rand_like", "randint_like", "randperm", "enable_grad",
            "set_grad_enabled", "promote_types", "result_type", "can_cast",
        )),
        *ALLOWED_TORCH_FUNCTIONS,
        *(f"torch.nn.{n}" for n in _NN_CLASSES),
        *(f"torch.nn.init.{n}" for n in _NN_INIT),
        "torch.nn.Module.__init__",  # ``nn.Module.__init__(self)``, the pre-super() idiom
    }
)
ALLOWED_NAMES = frozenset(
    {
        *TORCH_NAMES,
        *(f"torch.Tensor.{m}" for m in VIEW_METHODS | QUERY_METHODS - {"data_ptr", "item",
                                                                       "tolist"}),
        *(f"math.{n}" for n in dir(math) if not n.startswith("_")),
        *(f"typing.{n}" for n in (
            "Any", "Optional", "Union", "List", "Tuple", "Dict", "Set", "FrozenSet", "Sequence",
            "Mapping", "Iterable", "Iterator", "Callable", "Type", "TypeVar", "Generic",
            "ClassVar", "Final", "Literal", "NamedTuple", "Protocol", "cast", "TYPE_CHECKING",
            "overload", "Annotated", "TypeAlias", "Self", "NoReturn", "Never",
        )),
        *(f"__future__.{n}" for n in ("annotations", "division", "print_function",
                                      "absolute_import", "unicode_literals", "generator_stop")),
        *(f"multiminddev.cuda.{n}" for n in (
            "compile_kernels", "KernelCompileError", "KernelArgumentError", "NoGPUError",
            "CompiledKernels", "Kernel",
        )),
        "multiminddev.cuda.kernels.compile_kernels",
        *(f"functools.{n}" for n in ("cache", "lru_cache", "partial", "reduce", "wraps",
                                     "cached_property")),
        *(f"itertools.{n}" for n in ("product", "chain", "accumulate", "repeat", "islice",
                                     "zip_longest", "count", "pairwise", "starmap",
                                     "combinations", "permutations", "groupby")),
        *(f"collections.{n}" for n in ("namedtuple", "OrderedDict", "defaultdict", "deque",
                                       "Counter")),
        *(f"collections.abc.{n}" for n in ("Sequence", "Mapping", "Iterable", "Iterator",
                                           "Callable", "MutableMapping")),
        "dataclasses.dataclass", "dataclasses.field",
        *(f"enum.{n}" for n in ("Enum", "IntEnum", "auto")),
    }
)
# Modules and classes that are only prefixes of allowed names (``torch.cuda``, ``torch.nn.init``).
_NAMESPACES = frozenset(
    {name.rsplit(".", i)[0] for name in ALLOWED_NAMES for i in range(1, name.count(".") + 1)}
    | IMPORTABLE_MODULES
) - ALLOWED_NAMES
# Why a name off the allowlist is refused, by prefix (most specific first); anything else is
# refused as "not on the allowlist" (FORBIDDEN_IMPORT).
_REFUSAL_FAMILIES: tuple[tuple[tuple[str, ...], str, RejectReason, str], ...] = (
    (("torch.library", "torch.ops", "torch._ops", "torch._library", "torch._C._dispatch",
      "torch.utils._python_dispatch", "torch.overrides", "torch._C._EnablePythonDispatcher"),
     "dispatcher_registration", RejectReason.MONKEY_PATCH,
     ("reaches torch's dispatcher (operator registration / overrides); launch your own kernels "
      "directly and leave torch's operators alone")),
    (("torch.manual_seed", "torch.seed", "torch.initial_seed", "torch.random",
      "torch.set_rng_state", "torch.get_rng_state", "torch.Generator", "torch.default_generator",
      "torch.cuda.manual_seed", "torch.cuda.seed", "torch.cuda.set_rng_state",
      "torch.cuda.get_rng_state", "torch.cuda.random"),
     "rng_state", RejectReason.MONKEY_PATCH,
     "reads or sets torch's random state; candidates never touch the RNG"),
)


def _import_bindings(tree: ast.Module) -> dict[str, str]:
    """Local name -> qualified name, for names bound by import statements only."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                bound[a.asname or a.name] = f"{node.module}.{a.name}"
    return bound


def _allowed_name(qualified: str) -> bool:
    return qualified in ALLOWED_NAMES


def _refusal(qualified: str) -> tuple[str, RejectReason, str]:
    """(rule, reason, why) for a qualified name off the allowlist."""
    for prefixes, rule, reason, why in _REFUSAL_FAMILIES:
        if any(qualified == p or qualified.startswith((p + ".", p + "_")) for p in prefixes):
            return rule, reason, why
    if qualified in _NAMESPACES:
        return ("module_reference", RejectReason.FORBIDDEN_IMPORT,
                ("is a module (or namespace): use it only as the prefix of an allowed name "
                 "(torch.empty_like, torch.float32, nn.Module, torch.cuda.current_stream, "
                 "math.ceil); a module is never a value"))
    if any(part.startswith("_") for part in qualified.split(".")):
        return ("private_internals", RejectReason.FORBIDDEN_IMPORT,
                "is a private internal of torch or the harness")
    return ("not_allowlisted", RejectReason.FORBIDDEN_IMPORT,
            ("is not on the candidate allowlist (allocation: torch.empty/empty_like/zeros; views "
             "and shapes; dtypes; nn.Module/nn.Parameter and nn layers for weights; "
             "torch.cuda.current_stream; load_inline; math); compute belongs in your kernel"))


def check_forbidden_import(tree: ast.Module, source: str) -> list[Finding]:
    """Imports are an allowlist: IMPORTABLE_MODULES as namespaces, ALLOWED_NAMES as names.

    ``import m`` needs ``m`` importable; ``from p import n`` needs ``p.n`` to be an importable
    module (``from torch import nn``) or an allowed name (``from torch import Tensor``,
    ``from multiminddev.cuda import compile_kernels``). ``from torch import cuda`` is refused:
    torch.cuda is reachable only as ``torch.cuda.current_stream()``-style allowed names.

    Rationale: os/sys/ctypes/cffi/numpy/subprocess/socket/importlib/inspect/gc are escape
    hatches (find the reference through ``gc``/``sys.modules``, call cuBLAS or cudaMemcpy via
    ctypes, compute on the CPU with numpy, read the harness's files), and modules reached as
    attributes of allowed modules (``from torch import cuda`` then ``cuda.cudart()``) were the
    same hatches one step removed. An allowlist closes the class, not the cases.
    """
    findings = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name not in IMPORTABLE_MODULES:
                    findings.append(_import_finding(a.name, node))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                findings.append(_finding("relative_import", RejectReason.FORBIDDEN_IMPORT,
                                         "relative imports are not allowed", node))
                continue
            for a in node.names:
                name = f"{node.module}.{a.name}"
                if a.name == "*" or not (name in IMPORTABLE_MODULES or _allowed_name(name)):
                    findings.append(_import_finding(name, node))
    return _dedup(findings)


def _import_finding(name: str, node: ast.AST) -> Finding:
    rule, _, why = _refusal(name)
    if rule in {"not_allowlisted", "module_reference", "private_internals"}:
        why = (
            "is not importable: candidates import only torch, torch.nn, torch.nn.functional, "
            "torch.utils.cpp_extension (load_inline), math, typing, functools, itertools, "
            "collections, dataclasses, enum and multiminddev.cuda's public API "
            "(compile_kernels and its errors)")
    # An import is refused as an import whatever it reaches (the use site says what it is).
    return _finding("forbidden_import", RejectReason.FORBIDDEN_IMPORT, f"import of {name!r} {why}",
                    node)


def _parents(tree: ast.AST) -> dict[int, ast.AST]:
    return {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def check_torch_attributes(tree: ast.Module, source: str) -> list[Finding]:
    """Every name reached through an import is on ALLOWED_NAMES; modules are never values.

    Each maximal ``a.b.c`` chain whose root is an imported name is resolved (``nn.Linear`` ->
    ``torch.nn.Linear``) and must be an allowed name exactly. A module alone (``torch``,
    ``F``, ``torch.cuda``, ``torch.backends``) is a module-valued reference and is refused:
    passed to a function, stored, or aliased it reaches anything by name later. This applies
    everywhere in the module, not only in forward.

    Rationale: candidates reached the timer, the guards and the dispatcher through attributes
    of allowed modules (``torch.cuda.cudart``, ``torch._C``, ``torch.library``, ``torch.ops``,
    ``m = torch.cuda``; ``torch.manual_seed`` to make fresh inputs predictable); an allowlist
    of what a kernel wrapper needs (allocation, views, dtypes, weights, stream queries,
    load_inline) leaves nothing else reachable.
    """
    bindings = _import_bindings(tree)
    parents = _parents(tree)
    findings = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Name, ast.Attribute)):
            continue
        parent = parents.get(id(node))
        if isinstance(parent, ast.Attribute) and parent.value is node:
            continue  # not maximal: the enclosing chain is checked
        dotted = _dotted(node)
        if dotted is None or dotted.split(".")[0] not in bindings:
            continue
        qualified = _resolve_dotted(dotted, bindings)
        if _allowed_name(qualified):
            continue
        rule, reason, why = _refusal(qualified)
        findings.append(_finding(rule, reason, f"`{dotted}` ({qualified}) {why}", node))
    return _dedup(findings)


# Builtins a kernel wrapper needs: numbers, containers, iteration, shapes, classes, errors.
ALLOWED_BUILTINS = frozenset(
    {"abs", "all", "any", "bool", "callable", "chr", "complex", "dict", "divmod", "enumerate",
     "filter", "float", "format", "frozenset", "int", "isinstance", "issubclass", "iter", "len",
     "list", "map", "max", "min", "next", "ord", "pow", "print", "range", "repr", "reversed",
     "round", "set", "slice", "sorted", "str", "sum", "super", "tuple", "zip", "staticmethod",
     "classmethod", "property", "hex", "bin", "oct", "NotImplemented", "Ellipsis", "Exception",
     "StopIteration", "__name__",
     *(n for n in dir(builtins) if n.endswith(("Error", "Warning")))}
)
# Builtins allowed only in a restricted form (see _conditional_builtin_message).
CONDITIONAL_BUILTINS = frozenset({"getattr", "hasattr", "setattr", "delattr", "type", "object"})
# Refused even when the module binds the name somewhere: no candidate needs a variable called
# ``eval``, and scope tricks must not turn the real builtin into "the candidate's own".
DANGEROUS_BUILTINS = frozenset(
    {"eval", "exec", "compile", "__import__", "globals", "locals", "vars", "dir", "breakpoint",
     "open", "memoryview", "id", "hash", "__build_class__", "__builtins__", "__loader__",
     "__spec__", "help", "exit", "quit"}
)


def check_builtins(tree: ast.Module, source: str) -> list[Finding]:
    """Builtins are an allowlist (ALLOWED_BUILTINS); getattr & co. only with literal names.

    ``getattr``/``hasattr`` take a literal, public attribute name and never an imported
    module; ``setattr``/``delattr`` a literal public name on ``self``; ``type`` one argument;
    ``object`` only as a base class. None of these may be passed around as values. ``eval``,
    ``exec``, ``compile``, ``__import__``, ``globals``, ``vars``, ``open``, ``id``, ``hash`` and
    the other DANGEROUS_BUILTINS are refused outright.

    Rationale: string-named attribute access (``getattr(torch, "mat" + "mul")``,
    ``getattr(frame, name)``) and dynamic code hide every other rule from a static reading;
    ``type(name, bases, ns)`` builds classes the checks never saw; ``id``/``hash`` key caches by
    object identity.
    """
    bound = _names_bound_anywhere(tree)
    parents = _parents(tree)
    bindings = _import_bindings(tree)
    findings = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Name) or not isinstance(node.ctx, ast.Load):
            continue
        name = node.id
        if name in DANGEROUS_BUILTINS or (name.startswith("__") and name.endswith("__")
                                          and name not in ALLOWED_BUILTINS):
            findings.append(_finding("builtin_not_allowed", RejectReason.FORBIDDEN_IMPORT,
                                     f"`{name}` is not available to candidates (it hides code "
                                     "or identity from the checks); rename a variable of this "
                                     "name, and key caches by shapes, never by identity", node))
        elif name in CONDITIONAL_BUILTINS:
            message = _conditional_builtin_message(node, parents.get(id(node)), bindings, tree)
            if message:
                findings.append(_finding("dynamic_attribute", RejectReason.FORBIDDEN_IMPORT,
                                         message, node))
        elif (name in BUILTIN_NAMES and name not in ALLOWED_BUILTINS and name not in bound):
            findings.append(_finding("builtin_not_allowed", RejectReason.FORBIDDEN_IMPORT,
                                     f"builtin `{name}` is not on the candidate allowlist "
                                     "(numbers, containers, iteration, isinstance, super, "
                                     "exceptions); a kernel wrapper does not need it", node))
    return _dedup(findings)


def _literal_public_name(node: ast.AST | None) -> bool:
    return (isinstance(node, ast.Constant) and isinstance(node.value, str)
            and node.value.isidentifier() and not node.value.startswith("_"))


def _conditional_builtin_message(node: ast.Name, parent: ast.AST | None,
                                 bindings: dict[str, str], tree: ast.Module) -> str | None:
    name = node.id
    if name == "object":
        if isinstance(parent, ast.ClassDef) and node in parent.bases:
            return None
        return "`object` may only be a base class (object.__setattr__ & co. bypass the checks)"
    if not (isinstance(parent, ast.Call) and parent.func is node):
        return f"`{name}` may only be called directly, never passed around as a value"
    args = parent.args
    if name == "type":
        return None if len(args) == 1 and not parent.keywords else (
            "type() with more than one argument builds classes: define classes with `class`")
    if len(args) < 2 or not _literal_public_name(args[1]):
        return (f"{name}() needs a literal, public attribute name; write `obj.attr`, and keep "
                "numbered things in a list or nn.ModuleList (string-named attribute access "
                "hides what is reached)")
    root = _root(args[0])
    if isinstance(root, ast.Name) and root.id in bindings:
        return (f"{name}() on the imported {root.id!r}: write the attribute directly "
                f"(e.g. torch.float32), so the allowlist can check it")
    if name in {"setattr", "delattr"} and not (isinstance(args[0], ast.Name)
                                               and args[0].id == "self"):
        return f"{name}() only on self"
    return None


# Attribute names refused on any object (a denylist is unavoidable here: the candidate names
# its own attributes), grouped by what they reach.
INTROSPECTION_ATTRIBUTE = re.compile(
    r"^(gi|cr|ag|tb|co)_\w+$|^f_(back|globals|locals|builtins|code|trace\w*|lineno|lasti)$")
# Any hook, registered through the API or written into nn.Module's own tables
# (``self._forward_hooks[0] = fn``), on self or not.
HOOK_ATTRIBUTE = re.compile(r"hook|^register_module_\w+$", re.IGNORECASE)
EVENT_ATTRIBUTES = frozenset({"record_event", "wait_event", "wait_stream", "elapsed_time",
                              "record_stream"})
# ``stream.query()`` / ``event.query()`` tell whether queued GPU work has finished: a timing
# loop's back-to-back calls and a checked call's copy-out differ there, so the answer could
# tell timing from checking. Refused on anything but the candidate's own objects.
QUEUE_STATE_ATTRIBUTES = frozenset({"query"})
STORAGE_ATTRIBUTES = frozenset({"untyped_storage", "storage", "set_", "share_memory_"})
HOST_MEMORY_ATTRIBUTES = frozenset({"pin_memory", "is_pinned", "numpy"})
# Public attributes of compiled-kernel handles that are the harness's, not the candidate's.
KERNEL_HANDLE_INTERNALS = frozenset({"module", "signatures", "compile_result", "signature",
                                     "convert_args"})


def check_attribute_names(tree: ast.Module, source: str) -> list[Finding]:
    """No dunder, frame/generator/code, private or hook attributes, on anything but self.

    Allowed: ``super().__init__(...)``, ``nn.Module.__init__(self)``, ``Base.__init__(self)``
    for the candidate's own classes; private attributes (``self._cache``) of ``self``/``cls``
    and of the candidate's own classes; defining dunder methods. Refused: ``__class__``,
    ``__dict__``, ``__globals__``, ``__subclasses__``, ``__code__``, ``__self__``... on
    anything; ``gi_frame``/``cr_frame``/``f_back``/``tb_frame``/``co_code``...; private
    attributes of torch objects, tensors and kernel handles; the harness-side attributes of
    kernel handles (``kernels.module``, ``.signatures``, ``.compile_result``); forward/backward
    hooks; stream events; tensor storage and host (pinned) memory.

    Rationale: generator and frame objects reach the timing loop's frames and globals; dunder
    attributes reach classes, globals and builtins; a kernel handle's compiled module is the
    harness's compile cache; hooks run code the checks never see; events time the harness;
    pinned host memory lets the CPU compute the answer behind a token kernel.
    """
    info = _analyse_cached(source)
    bindings = _import_bindings(tree)
    findings = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            found = _attribute_finding(node, info, bindings)
            if found:
                findings.append(_finding(*found, node))
    return _dedup(findings)


def check_name_reads(tree: ast.Module, source: str) -> list[Finding]:
    """Attribute reads the attribute rules cannot see, and ``self``/``cls`` as any other value.

    Refused: keyword attributes of ``match`` class patterns (``case F(__globals__=g)`` reads
    ``__globals__``); ``str.format``/``format_map`` fields that reach attributes or items
    (``"{0.gi_frame.f_back}".format(g)``), and either method on a string that is not a literal;
    ``self``/``cls`` bound anywhere but as the first parameter of a method, and the
    candidate's class names rebound.

    Rationale: the attribute rules trust ``self``, ``cls`` and the candidate's own classes as
    receivers and read attribute names from the syntax tree; a pattern keyword or a format field
    reads an attribute the tree shows only as a string, and a rebound ``self`` lends that trust
    to a frame or a module.
    """
    info = _analyse_cached(source)
    parents = _parents(tree)
    findings = []
    for node in ast.walk(tree):
        if isinstance(node, ast.MatchClass) and node.kwd_attrs:
            findings.append(_finding(
                "introspection", RejectReason.FORBIDDEN_IMPORT,
                f"a class pattern reads attributes by keyword ({', '.join(node.kwd_attrs)[:60]}); "
                "read attributes directly", node))
        elif isinstance(node, ast.MatchClass) and node.patterns and not (
                isinstance(node.cls, ast.Name) and node.cls.id in SELF_MATCHING_BUILTINS):
            findings.append(_finding(
                "introspection", RejectReason.FORBIDDEN_IMPORT,
                f"a class pattern with positional parts reads the attributes its class's "
                f"__match_args__ names; match only builtin types (int(x), str(s))", node))
        elif isinstance(node, ast.Attribute) and node.attr in {"format", "format_map"}:
            parent = parents.get(id(node))
            called = isinstance(parent, ast.Call) and parent.func is node
            message = (_format_message(node.value) if called else
                       f"`.{node.attr}` taken as a value: its template could reach any "
                       "attribute; call it on a literal template or use an f-string")
            if message:
                findings.append(_finding("introspection", RejectReason.FORBIDDEN_IMPORT,
                                         message, node))
        elif isinstance(node, ast.ClassDef) and (node.keywords or not all(
                isinstance(base, (ast.Name, ast.Attribute)) for base in node.bases)):
            findings.append(_finding(
                "hook", RejectReason.MONKEY_PATCH,
                f"class {node.name} names a metaclass, class keywords or a computed base; "
                "derive from named classes only", node))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "type" and not (
                    len(node.args) == 1 and not node.keywords
                    and isinstance(node.args[0], ast.Name) and node.args[0].id == "self")):
            findings.append(_finding(
                "introspection", RejectReason.FORBIDDEN_IMPORT,
                "type(...) of anything but self hands out classes and metaclasses (which build "
                "new classes); compare dtypes and shapes instead", node))
        for name, where in _bound_names(node, parents):
            if name in HOOK_DUNDERS and where in {"by a def", "by an assignment"}:
                findings.append(_finding(
                    "hook", RejectReason.MONKEY_PATCH,
                    f"defines {name}, which changes how Python looks up, matches or checks "
                    "objects; kernel wrappers need none of it", node))
            elif name in SELF_MATCHING_BUILTINS:
                findings.append(_finding(
                    "rebound_self", RejectReason.FORBIDDEN_IMPORT,
                    f"the builtin `{name}` is bound again {where}; give the value a name of "
                    "its own", node))
            if name in {"self", "cls"} and where != "method_receiver":
                findings.append(_finding(
                    "rebound_self", RejectReason.FORBIDDEN_IMPORT,
                    f"`{name}` is bound {where}; `self`/`cls` name only a method's own "
                    "object or class", node))
            elif name in info.classes and where not in {"class", "method_receiver"}:
                findings.append(_finding(
                    "rebound_self", RejectReason.FORBIDDEN_IMPORT,
                    f"the class name `{name}` is bound again {where}; give the value a name "
                    "of its own", node))
    return _dedup(findings)


# Builtin types whose class pattern matches the subject itself (``case int(x)``), never an
# attribute of it.
SELF_MATCHING_BUILTINS = frozenset({"bool", "bytearray", "bytes", "dict", "float", "frozenset",
                                    "int", "list", "set", "str", "tuple"})
# Special names that make attribute lookup, pattern matching, isinstance or class creation run
# the candidate's code on objects it does not own.
HOOK_DUNDERS = frozenset({"__getattr__", "__getattribute__", "__setattr__", "__delattr__",
                          "__match_args__", "__subclasshook__", "__instancecheck__",
                          "__subclasscheck__", "__init_subclass__", "__set_name__",
                          "__class_getitem__", "__get__", "__set__", "__delete__",
                          "__mro_entries__", "__prepare__", "__class__", "__new__",
                          "__exit__", "__aexit__"})


def check_module_overrides(tree: ast.Module, source: str) -> list[Finding]:
    """A module class defines ``__init__``, ``forward`` and helpers of its own names only, and
    never calls ``self.compile``.

    Rationale: the harness builds the model with ``ModelNew(...).cuda().eval()`` and calls the
    result: a class that redefines ``eval``, ``cuda``, ``to``, ``__call__`` or any other
    ``nn.Module`` method can hand the harness another object, whose code no forward rule
    reads; ``self.compile`` puts torch.compile's generated code on the call path.
    """
    module_api, module_state = _module_names()
    info = _analyse_cached(source)
    findings = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and _is_module_class(node, info):
            for item in node.body:
                names = ([item.name] if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                         else [t.id for t in _assignment_targets(item) if isinstance(t, ast.Name)])
                for name in names:
                    if name in module_api:
                        findings.append(_finding(
                            "module_override", RejectReason.MONKEY_PATCH,
                            f"{node.name} redefines nn.Module.{name}, which the harness calls; "
                            "define __init__, forward and helpers with names of your own", item))
        for target in _assignment_targets(node):
            if isinstance(target, ast.Subscript):  # self._modules["k"] = ... writes that state too
                target = target.value
            if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                    and target.value.id == "self" and target.attr in module_state):
                findings.append(_finding(
                    "module_override", RejectReason.MONKEY_PATCH,
                    f"self.{target.attr} is nn.Module's own state, which decides what calling "
                    "the model runs; keep your state under names of your own", node))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "compile" and isinstance(node.func.value, ast.Name)
              and node.func.value.id == "self"):
            findings.append(_finding("module_override", RejectReason.MONKEY_PATCH,
                                     "self.compile(...) runs torch.compile's code in place of "
                                     "forward; launch your kernels in forward", node))
    return _dedup(findings)


@functools.cache
def _module_names() -> tuple[frozenset[str], frozenset[str]]:
    """nn.Module's methods a module class may not redefine, and the attributes of its state."""
    import torch

    api = frozenset(dir(torch.nn.Module)) - {"__init__", "forward", "extra_repr", "__repr__",
                                              "__doc__", "__module__", "__dict__"}
    return api, (api | frozenset(vars(torch.nn.Module()))) - {"training"}


def check_definitions_resolve(tree: ast.Module, source: str) -> list[Finding]:
    """Every class and function the module defines is defined once, unconditionally, and a
    class has one base at most among the candidate's module classes.

    Rationale: the rules read the ``forward`` (and helpers) that the syntax shows; Python runs
    the one that is bound last or found first in the method order. A second ``def`` of the same
    name, a definition under ``if``, a class-body ``forward = other``, or two bases each defining
    ``forward`` would let the code that runs differ from the code that was read.
    """
    info = _analyse_cached(source)
    findings = []
    for body, where in [(tree.body, "the module"),
                        *((c.body, f"class {c.name}") for c in ast.walk(tree)
                          if isinstance(c, ast.ClassDef))]:
        defined: dict[str, int] = {}
        for item in body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [item.name]
            else:
                names = [t.id for t in _assignment_targets(item) if isinstance(t, ast.Name)]
                names += [a.asname or a.name.split(".")[0] for a in getattr(item, "names", ())
                          if isinstance(item, (ast.Import, ast.ImportFrom))]
                for inner in ast.walk(item):
                    if inner is not item and isinstance(
                            inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not (
                            isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))):
                        findings.append(_finding(
                            "definition_resolution", RejectReason.MONKEY_PATCH,
                            f"{inner.name} is defined inside a statement of {where}; define "
                            "classes and functions unconditionally, once", inner))
            for name in names:
                if _extends_definition(item, name):
                    continue
                if name in defined and (defined[name] or isinstance(
                        item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))):
                    findings.append(_finding(
                        "definition_resolution", RejectReason.MONKEY_PATCH,
                        f"`{name}` is bound again in {where} after a class or function of that "
                        "name; give each definition a name of its own", item))
                defined[name] = defined.get(name, False) or isinstance(
                    item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    for node in ast.walk(tree):
        if (isinstance(node, ast.ClassDef) and len(node.bases) > 1
                and _is_module_class(node, info)):
            findings.append(_finding(
                "definition_resolution", RejectReason.MONKEY_PATCH,
                f"class {node.name} has several bases: which forward runs depends on the method "
                "order; derive from one class", node))
    return _dedup(findings)


def _extends_definition(item: ast.AST, name: str) -> bool:
    """A def that adds to the earlier one of its name rather than replacing it unseen:
    ``@name.setter``/``.getter``/``.deleter`` of a property, ``@name.register`` of a
    ``functools.singledispatch`` function, ``@typing.overload`` stubs."""
    if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    for decorator in item.decorator_list:
        if (isinstance(decorator, ast.Attribute) and isinstance(decorator.value, ast.Name)
                and decorator.value.id == name
                and decorator.attr in {"setter", "getter", "deleter", "register"}):
            return True
        if _dotted(decorator) in {"overload", "typing.overload"}:
            return True
    return False


def _is_module_class(node: ast.ClassDef, info: ModuleInfo, depth: int = 0) -> bool:
    for base in node.bases:
        name = resolve(base, info.aliases)
        if name and name.startswith("torch.nn."):  # nn.Module, or any layer built on it
            return True
        own = info.classes.get(base.id) if isinstance(base, ast.Name) else None
        if own is not None and depth < 8 and _is_module_class(own, info, depth + 1):
            return True
    return False


def _format_message(template: ast.AST) -> str | None:
    if not (isinstance(template, ast.Constant) and isinstance(template.value, str)):
        return ("`.format`/`.format_map` on a string built at run time: its fields could "
                "reach any attribute; use an f-string or a literal template")
    try:
        fields = _format_fields(template.value)
    except ValueError:
        return "a format string that does not parse"
    for field_name in fields:
        if "." in field_name or "[" in field_name:
            return (f"the format field {{{field_name[:40]}}} reaches an attribute or item; "
                    "format plain values")
    return None


def _format_fields(template: str, depth: int = 0) -> list[str]:
    import string

    fields = []
    for _, field_name, spec, _ in string.Formatter().parse(template):
        if field_name is not None:
            fields.append(field_name)
        if spec and depth < 2:
            fields.extend(_format_fields(spec, depth + 1))
    return fields


def _bound_names(node: ast.AST, parents: dict[int, ast.AST]) -> list[tuple[str, str]]:
    """(name, how) for every name ``node`` binds; how is "method_receiver" for the first
    parameter of a function defined in a class body, "class" for a class definition."""
    if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
        return [(node.id, "by an assignment")]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        args = node.args
        positional = [*args.posonlyargs, *args.args]
        in_class = isinstance(parents.get(id(node)), ast.ClassDef)
        out = []
        for i, arg in enumerate([*positional, *args.kwonlyargs,
                                 *([args.vararg] if args.vararg else []),
                                 *([args.kwarg] if args.kwarg else [])]):
            receiver = in_class and i == 0 and positional and arg is positional[0]
            out.append((arg.arg, "method_receiver" if receiver else "as a parameter"))
        if not isinstance(node, ast.Lambda):
            out.append((node.name, "by a def"))
        return out
    if isinstance(node, ast.ClassDef):
        return [(node.name, "class")]
    if isinstance(node, ast.ExceptHandler) and node.name:
        return [(node.name, "by an except clause")]
    if isinstance(node, ast.alias):
        return [((node.asname or node.name).split(".")[0], "by an import")]
    if isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
        return [(node.name, "by a match pattern")]
    if isinstance(node, ast.MatchMapping) and node.rest:
        return [(node.rest, "by a match pattern")]
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return [(name, "by a global/nonlocal statement") for name in node.names]
    return []


def _own_receiver(node: ast.AST, info: ModuleInfo) -> bool:
    """``self``/``cls`` or one of the candidate's own classes."""
    return isinstance(node, ast.Name) and (node.id in {"self", "cls"} or node.id in info.classes)


def _attribute_finding(node: ast.Attribute, info: ModuleInfo, bindings: dict[str, str]
                       ) -> tuple[str, RejectReason, str] | None:
    attr, value = node.attr, node.value
    root = _root(node)
    # A plain dotted name from an import is check_torch_attributes' job; once a call or an
    # index is in the chain (``torch.nn.Module().__init__``), the value is an object like any.
    imported = (isinstance(root, ast.Name) and root.id in bindings
                and _dotted(node) is not None)
    if attr.startswith("__") and attr.endswith("__"):
        if attr == "__init__" and (_own_receiver(value, info) or (
                isinstance(value, ast.Call) and _dotted(value.func) == "super") or imported):
            return None
        if imported:
            return None
        return ("introspection", RejectReason.FORBIDDEN_IMPORT,
                (f"`.{attr}` reaches interpreter internals (classes, globals, code); only "
                 "super().__init__(...) is allowed"))
    if INTROSPECTION_ATTRIBUTE.match(attr) and not _own_receiver(value, info):
        return ("introspection", RejectReason.FORBIDDEN_IMPORT,
                f"`.{attr}` reaches frames, generators or code objects (the harness's stack)")
    if attr.startswith("_") and not _own_receiver(value, info) and not imported:
        return ("private_internals", RejectReason.FORBIDDEN_IMPORT,
                (f"`.{attr}` is private to an object that is not yours (torch, a tensor, a "
                 "kernel handle); use its public API"))
    if HOOK_ATTRIBUTE.search(attr):
        return ("hook", RejectReason.MONKEY_PATCH,
                (f"`.{attr}` installs a hook that runs code outside forward; do the work in "
                 "forward with your kernels"))
    if attr in EVENT_ATTRIBUTES:
        return ("streams_events_graphs", RejectReason.CONCURRENCY,
                (f"`.{attr}` uses CUDA events or cross-stream waits; launch on the current "
                 "stream only"))
    if attr in QUEUE_STATE_ATTRIBUTES and not _own_receiver(value, info):
        return ("streams_events_graphs", RejectReason.CONCURRENCY,
                (f"`.{attr}()` asks whether queued GPU work has finished, which tells timed "
                 "calls from checked ones; launch on the current stream and do not poll it"))
    if attr in STORAGE_ATTRIBUTES:
        return ("tensor_storage", RejectReason.POINTER_CACHE,
                (f"`.{attr}` reaches tensor storage identity; allocate outputs with "
                 "torch.empty_like and write them with your kernel"))
    if attr in HOST_MEMORY_ATTRIBUTES:
        return ("host_memory", RejectReason.TORCH_COMPUTE,
                f"`.{attr}` moves work to host memory; all compute runs in your CUDA kernels")
    if attr in KERNEL_HANDLE_INTERNALS and _holds_kernels(value, info):
        return ("harness_internals", RejectReason.FORBIDDEN_IMPORT,
                (f"`.{attr}` of a kernel handle belongs to the harness; a handle's only "
                 "attributes are your kernels (kernels.<name>(grid=..., block=..., args=...))"))
    return None


HOST_READ_METHODS = frozenset({"item", "tolist", "cpu", "numpy"})
# Container methods that store into ``self.<attr>`` (in-place tensor methods end with ``_``).
MUTATING_METHODS = frozenset({"append", "extend", "insert", "update", "setdefault", "add",
                              "__setitem__", "put"})
# Builtins that read a tensor's values on the host when given one.
HOST_READ_BUILTINS = frozenset({"int", "float", "bool", "complex", "str", "repr", "format",
                                "print", "round", "list", "tuple", "sum", "max", "min",
                                "sorted", "abs", "divmod", "hash"})


def check_host_reads(tree: ast.Module, source: str) -> list[Finding]:
    """forward (and what it calls) never reads tensor values on the host.

    Refused in forward's reach: ``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``,
    ``.to("cpu")``; ``int(t)``, ``float(t)``, ``bool(t)``, ``print(t)``, f-strings of a
    tensor; a tensor as an ``if``/``while``/``assert``/``and``/``or``/``not`` condition (an
    implicit ``bool(t)``); ``.data_ptr()`` except for an alignment test (``p % 16``). Allowed:
    these on attributes of ``self`` set only in ``__init__`` (weights and constants, e.g. a
    scalar parameter passed to a kernel as ``self.scale.item()``).

    Rationale: a few values read on the host key a cache of results (class "result caching
    across calls"): the kernel then runs only on a miss. Outputs must depend on the inputs
    through the kernel alone.
    """
    info = _analyse_cached(source)
    reassigned = _self_attrs_set_outside_init(info)
    parents = _parents(info.tree)  # the scopes' nodes come from info.tree's parse
    findings = []
    for scope, node in _walk_scopes(info):
        message = _host_read_message(node, scope.tensors, info, reassigned, parents)
        if message:
            findings.append(_finding("host_read", RejectReason.POINTER_CACHE,
                                     f"{message} in forward reads tensor values on the host "
                                     "(that enables caching results by value); pass tensors to "
                                     "your kernel, read scalars from parameters in __init__",
                                     node))
    return _dedup(findings)


def _self_attrs_set_outside_init(info: ModuleInfo) -> set[str]:
    if info.model_new is None:
        return set()
    out = set()
    for name, method in info.methods(info.model_new).items():
        if name == "__init__":
            continue
        for target, _ in _assignments(method):
            while isinstance(target, (ast.Subscript, ast.Attribute)) and _self_attr(target) is None:
                target = target.value
            attr = _self_attr(target)
            if attr is not None:
                out.add(attr)
        for n in ast.walk(method):  # ``self.x += t``, ``self.cache.append(t)``, ``self.w.copy_(t)``
            if isinstance(n, ast.AugAssign) and _self_attr(n.target):
                out.add(_self_attr(n.target))
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                    and (n.func.attr in MUTATING_METHODS or n.func.attr.endswith("_"))):
                owner = _self_attr(n.func.value)
                if owner is not None:
                    out.add(owner)
    return out


def _init_only(node: ast.AST, reassigned: set[str]) -> bool:
    """``self.w`` / ``self.lin.weight`` where the first attribute is set only in __init__."""
    while isinstance(node, ast.Attribute) and _self_attr(node) is None:
        node = node.value
    attr = _self_attr(node)
    return attr is not None and attr not in reassigned


def _host_read_message(node: ast.AST, tensors: set[str], info: ModuleInfo, reassigned: set[str],
                       parents: dict[int, ast.AST]) -> str | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        receiver, method = node.func.value, node.func.attr
        if method in HOST_READ_METHODS and not _init_only(receiver, reassigned):
            return f"`.{method}()`"
        if method == "to" and any(_names_cpu(a) for a in (*node.args,
                                                           *(k.value for k in node.keywords))):
            return "`.to('cpu')`"
        if method == "data_ptr":
            parent = parents.get(id(node))
            if not _alignment_test(node, parent):
                return "`.data_ptr()` (other than an alignment test `p % 16`)"
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in HOST_READ_BUILTINS
            and any(is_tensor_expr(a, tensors, info) and not _init_only(a, reassigned)
                    for a in node.args)):
        return f"`{node.func.id}()` of a tensor"
    if isinstance(node, ast.FormattedValue) and is_tensor_expr(node.value, tensors, info):
        return "formatting a tensor"
    tests: list[ast.AST] = []
    if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
        tests = [node.test]
    elif isinstance(node, ast.BoolOp):
        tests = list(node.values)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        tests = [node.operand]
    if any(is_tensor_expr(t, tensors, info) and not _init_only(t, reassigned) for t in tests):
        return "a tensor used as a condition (an implicit bool(tensor))"
    return None


def _alignment_test(node: ast.AST, parent: ast.AST | None) -> bool:
    """``p % 16`` / ``p & 15`` with a small constant: a few low bits say nothing about
    which tensor it is, the whole pointer would."""
    return (isinstance(parent, ast.BinOp) and isinstance(parent.op, (ast.Mod, ast.BitAnd))
            and parent.left is node and isinstance(parent.right, ast.Constant)
            and type(parent.right.value) is int and 0 < parent.right.value <= 1024)


def _names_cpu(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Constant) and isinstance(n.value, str)
               and n.value.split(":")[0] == "cpu" for n in ast.walk(node))


def check_precision_downgrade(tree: ast.Module, source: str, *,
                              problem_dtype: str = "float32") -> list[Finding]:
    """No casting to fp16/bf16 (in forward or inside kernels) on a float32 problem.

    Rationale: half-precision compute is ~2-16x faster and can pass loose tolerances on easy
    inputs; the reward must compare like with like. Only applies when the problem is float32.
    """
    if problem_dtype != "float32":
        return []
    info = _analyse_cached(source)
    findings = []
    for _, node in _walk_scopes(info):
        name = resolve(node, info.aliases) if isinstance(node, ast.Attribute) else None
        if name in LOW_PRECISION_DTYPES:
            findings.append(_finding("low_precision_dtype", RejectReason.PRECISION_DOWNGRADE,
                                     f"uses {name} on a float32 problem", node))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in LOW_PRECISION_METHODS):
            findings.append(_finding("low_precision_cast", RejectReason.PRECISION_DOWNGRADE,
                                     f".{node.func.attr}() on a float32 problem", node))
    for node, code in _native_sources(tree):
        match = LOW_PRECISION_CUDA.search(code) or next(
            (m for a, b in _asm_spans(code) if (m := LOW_PRECISION_PTX.search(code, a, b))), None)
        if match:
            findings.append(Finding(rule="low_precision_kernel", reason=RejectReason.PRECISION_DOWNGRADE,
                                    line=_native_line(node, code, match.start()),
                                    message=f"kernel code uses `{match.group(0).strip()}` on a float32 "
                                            "problem: compute in float32"))
    aliases = import_aliases(tree)
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and resolve(call.func, aliases) in COMPILE_KERNELS:
            fast = next((k.value for k in call.keywords if k.arg == "use_fast_math"), None)
            if fast is not None and not (isinstance(fast, ast.Constant) and fast.value is False):
                findings.append(_finding("fast_math_flag", RejectReason.PRECISION_DOWNGRADE,
                                         "compile_kernels(use_fast_math=...) approximates float32 "
                                         "math on a float32 problem: leave it out", call))
    for call, arg, flag in native_builds(tree).flags:
        if arg in ("extra_cflags", "extra_cuda_cflags") and FAST_MATH_FLAG.search(flag):
            findings.append(_finding("fast_math_flag", RejectReason.PRECISION_DOWNGRADE,
                                     f"{arg} `{flag}` approximates float32 math on a float32 "
                                     "problem: leave it out", call))
    return _dedup(findings)


def check_returns_input(tree: ast.Module, source: str) -> list[Finding]:
    """forward must not return one of its inputs (or a view of one).

    Rationale: "in-place" hacks write the result into the input buffer and return it — the
    input is corrupted for the reference and the output aliases the input. The runtime guard
    checks storage overlap; this catches the visible case early.
    """
    info = _analyse_cached(source)
    scopes = reachable_scopes(info)
    if not scopes:
        return []
    aliases = scopes[0].aliases_of_inputs
    findings = []
    for node in ast.walk(scopes[0].fn):
        if isinstance(node, ast.Return) and node.value is not None:
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            if any(_is_view_of(v, aliases, info.aliases) for v in values):
                findings.append(_finding("returns_input", RejectReason.OUTPUT_ALIASING,
                                         "forward returns its input, a view of it, or a "
                                         "conversion that can be the input itself "
                                         "(`.contiguous()`, `.to()`, `.float()`): write to a new "
                                         "output tensor", node))
    return findings


# Native (C++/CUDA) source: load_inline wrappers run natively, outside every Python-level check.
# One lexer pass over C/C++/CUDA: comments, string and character literals. Comments and
# literals are prose or data, not code, so rules never match inside them; the string literals
# of inline ``asm(...)`` statements are PTX code and are kept.
_CXX_LEXEMES = re.compile(r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.DOTALL)
_ASM_START = re.compile(r"\b(?:asm|__asm__|__asm)\b(?:\s*(?:volatile|__volatile__))?\s*\(")


def _asm_spans(text: str) -> list[tuple[int, int]]:
    """[start, end) of every ``asm(...)`` statement (balanced parentheses, literals skipped)."""
    spans = []
    for start in _ASM_START.finditer(text):
        depth, i = 1, start.end()
        while i < len(text) and depth:
            lexeme = _CXX_LEXEMES.match(text, i)
            if lexeme:
                i = lexeme.end()
                continue
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        spans.append((start.start(), i))
    return spans


def cuda_code(text: str) -> str:
    """``text`` with comments and (non-asm) string/char literals blanked; newlines and length
    kept, so offsets still give line numbers."""
    spans = _asm_spans(text)

    def blank(m: re.Match[str]) -> str:
        lexeme = m.group(0)
        if lexeme[0] == '"' and any(a <= m.start() < b for a, b in spans):
            return lexeme  # PTX inside asm(...)
        return "".join("\n" if c == "\n" else " " for c in lexeme)

    return _CXX_LEXEMES.sub(blank, text)
NATIVE_RULES: tuple[tuple[str, RejectReason, re.Pattern[str]], ...] = (
    ("native_streams_threads", RejectReason.CONCURRENCY, re.compile(
        r"\b(cudaStreamCreate\w*|getStreamFromPool|getStreamFromExternal|cudaStreamBeginCapture|"
        r"cudaGraph\w*|cudaLaunchHostFunc|cudaStreamAddCallback|cudaStreamPerThread|"
        r"cudaStreamLegacy|CU_STREAM_PER_THREAD|CU_STREAM_LEGACY|cuStreamCreate\w*|"
        r"pthread_create|std\s*::\s*thread|std\s*::\s*async|std\s*::\s*jthread|at\s*::\s*launch)\b|"
        r"#\s*include\s*<(thread|future|pthread\.h)>")),
    # Named, not only called: ``auto f = ::system; f("ls")`` calls it through a pointer.
    ("native_escape", RejectReason.FORBIDDEN_IMPORT, re.compile(
        r"(?<![\w.])(?<!->)(system|popen|fork|vfork|execl|execle|execlp|execv|execve|execvp|"
        r"execvpe|posix_spawnp?|dlopen|dlsym|socket|connect|fopen|freopen|getenv|setenv|putenv|"
        r"mprotect|ptrace|unlink|unlinkat|rename|renameat|rmdir|mkdir|symlink|chmod|"
        r"chown|opendir|readdir|PyRun_\w+|PyImport_\w+)\b|"
        r"\bstd\s*::\s*(experimental\s*::\s*)?filesystem\b|"
        r"\b(std::[io]?fstream|py::exec|py::eval|pybind11::exec|pybind11::eval|"
        r"(py|pybind11)::module_?::import)\b|"
        r"#\s*include\s*<(dlfcn\.h|unistd\.h|sys/socket\.h|fstream|(experimental/)?filesystem|"
        r"dirent\.h|sys/stat\.h|"
        r"spawn\.h|sys/mman\.h|Python\.h)>")),
    # Raw descriptor I/O and system calls: a wrapper has nothing to read or write but tensors,
    # and a descriptor it holds may be the evaluator's pipe (a frame written there would pose as
    # the harness's). Member calls (``s.write(``) are not these functions.
    ("native_descriptor_io", RejectReason.FORBIDDEN_IMPORT, re.compile(
        r"(?<![\w.>])(?:::\s*)?\b(write|pwrite|writev|pwritev|send|sendto|sendmsg|open|openat|"
        r"creat|dup|dup2|dup3|fcntl|ioctl|mmap|kill|prctl)\s*\(|\bsyscall\b|\bSYS_\w+")),
    # Registering kernels with torch's dispatcher from C++ overrides torch ops for everyone
    # (the harness included): the native form of torch.library.
    ("native_dispatcher_registration", RejectReason.MONKEY_PATCH, re.compile(
        r"\b(TORCH_LIBRARY\w*|c10::Dispatcher|RegisterOperators|registerFallback|"
        r"c10::impl::\w+)\b")),
    # Vendor libraries compute with kernels that are not the candidate's.
    ("native_vendor_library", RejectReason.TORCH_COMPUTE, re.compile(
        r"(?<![\w.])(?<!->)((cublas|cudnn|cufft|cusparse|cusolver)[A-Z]\w*|"
        r"getCurrentCUDABlasHandle\w*)\b|"
        r"#\s*include\s*<(cublas\w*\.h|cublasLt\.h|cudnn\w*\.h|cufft\w*\.h|cusparse\.h|"
        r"cusolver\w*\.h|ATen/cuda/CUDABlas\.h)>")),
)
# ATen calls a C++ wrapper may make: allocation and metadata. Everything else is torch compute.
NATIVE_ALLOWED_ATEN = frozenset(
    {"empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
     "full_like", "from_blob", "device", "dtype", "scalarTypeToTypeMeta", "typeMetaToScalarType"}
)
_ATEN_CALL = re.compile(r"\b(?:torch|at)::([a-z_][a-z0-9_]*)\s*\(")
_TENSOR_COMPUTE_METHOD = re.compile(
    r"\.\s*(matmul|mm|bmm|addmm|baddbmm|einsum|sum|mean|prod|softmax|log_softmax|relu|gelu|"
    r"sigmoid|tanh|exp|log|sqrt|rsqrt|pow|clamp|clamp_min|clamp_max|abs|neg|conv[123]d|linear|"
    r"layer_norm|batch_norm|max_pool[123]d|avg_pool[123]d|cumsum|sort|topk|clone|copy_|add|sub|"
    r"mul|div|add_|sub_|mul_|div_|maximum|minimum|where)\s*\(")


def _docstrings(tree: ast.Module) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


# load_inline arguments that become compiled code, and those that become compiler/linker flags.
INLINE_SOURCE_ARGS = ("cpp_sources", "cuda_sources")
INLINE_FLAG_ARGS = ("extra_cflags", "extra_cuda_cflags", "extra_ldflags", "extra_include_paths")
COMPILE_KERNELS = frozenset({"multiminddev.cuda.compile_kernels",
                             "multiminddev.cuda.kernels.compile_kernels"})
# Compiler flags a kernel build may pass (exact match after stripping). Everything else is
# refused: -D/-U rename or define away anything the rules read (``-DSHELL=system``), -l/-L/-Wl,
# link vendor or planted libraries, -include/-I/-x/-Wp, inject files and languages.
SAFE_FLAG = re.compile(
    r"-O[0-3s]?|-std=(c|gnu)\+\+\d\d|-g|-lineinfo|-w|-Wall|-Wextra|-Wno-[a-z0-9-]+|"
    r"-{1,2}use_fast_math|-ffast-math|--expt-relaxed-constexpr|--expt-extended-lambda|"
    r"--extended-lambda|-{1,2}maxrregcount[= ]?\d+|-arch=(sm|compute)_\d+a?|"
    r"--gpu-architecture=(sm|compute)_\d+a?|-gencode=arch=compute_\d+a?,code=(sm|compute)_\d+a?|"
    r"(-Xptxas[= ]?|--ptxas-options=)?(-v|--verbose|-O[0-3]|-warn-spills|-warn-lmem-usage)|"
    r"-Xptxas|"  # its option is the next list item, checked on its own
    r"-fPIC|-DNDEBUG|"
    # torch defines these four to keep half/bfloat16 operators out of CUDA code; undefining
    # them (KernelBench style) only enables the operators.
    r"-U__CUDA_NO_HALF_OPERATORS__|-U__CUDA_NO_HALF_CONVERSIONS__|-U__CUDA_NO_HALF2_OPERATORS__|"
    r"-U__CUDA_NO_BFLOAT16_CONVERSIONS__|-U__CUDA_NO_BFLOAT16_OPERATORS__|"
    r"-U__CUDA_NO_BFLOAT162_OPERATORS__|-U__CUDA_NO_BFLOAT162_CONVERSIONS__")
# compile_kernels(defines=...) computed in Python: compile_kernels lets names and numbers only
# through (cuda.compiler.define_options), so the source may compute them; these build text.
DEFINE_TEXT_BUILDERS = frozenset({"str", "repr", "ascii", "chr", "format", "bytes", "bytearray"})
DEFINE_TEXT_METHODS = frozenset({"format", "format_map", "join", "replace", "decode", "strip"})
DEFINE_FSTRING_HEAD = re.compile(r"[A-Za-z_]\w*=")
TOKEN_PASTE = re.compile(r"##")
FAST_MATH_FLAG = re.compile(r"-{1,2}use_fast_math|-ffast-math|-Ofast|--ftz=true|--prec-div=false|"
                            r"--prec-sqrt=false|--fmad=true")


@dataclass
class NativeBuilds:
    """What the candidate's kernel builders compile, resolved statically (as the trusted
    builder resolves it: ``inline_build``): every source string, with the node it came from;
    every flag; and the load_inline calls whose arguments are computed at run time."""

    sources: list[tuple[ast.AST, str]] = field(default_factory=list)
    flags: list[tuple[ast.AST, str, str]] = field(default_factory=list)  # (call, argument, flag)
    functions: list[tuple[ast.AST, str]] = field(default_factory=list)
    not_static: list[ast.Call] = field(default_factory=list)
    defines: list[tuple[ast.Call, ast.expr]] = field(default_factory=list)  # (call, defines=)


def _is_load_inline(call: ast.Call, aliases: dict[str, str]) -> bool:
    from multiminddev.env import inline_build

    return (resolve(call.func, aliases) == "torch.utils.cpp_extension.load_inline"
            or inline_build._callee_name(call.func) == "load_inline")


def _strings(value: object) -> list[str] | None:
    """A resolved argument as a list of strings (None: not strings)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return list(value)  # load_inline(functions={name: docstring})
    return None


def native_builds(tree: ast.Module) -> NativeBuilds:
    """Resolve every ``load_inline`` / ``compile_kernels`` call of the module."""
    from multiminddev.env import inline_build

    aliases = import_aliases(tree)
    consts = inline_build._module_constants(tree)
    builds = NativeBuilds()
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call):
            continue
        if _is_load_inline(call, aliases):
            bound = inline_build._bind_static(call, consts)
            if bound is None:
                builds.not_static.append(call)
                continue
            texts = {key: _strings(bound.get(key)) for key in (*INLINE_SOURCE_ARGS, "functions",
                                                               *INLINE_FLAG_ARGS)}
            if any(v is None for v in texts.values()):
                builds.not_static.append(call)
                continue
            builds.sources += [(call, t) for key in INLINE_SOURCE_ARGS for t in texts[key]]
            builds.functions += [(call, t) for t in texts["functions"]]
            builds.flags += [(call, key, t) for key in INLINE_FLAG_ARGS for t in texts[key]]
        elif resolve(call.func, aliases) in COMPILE_KERNELS:
            arg = call.args[0] if call.args else next(
                (k.value for k in call.keywords if k.arg == "source"), None)
            value = inline_build._static_value(arg, consts) if arg is not None else None
            if isinstance(value, str):
                builds.sources.append((call, value))
            builds.defines += [(call, k.value) for k in call.keywords if k.arg == "defines"]
    return builds


def _native_sources(tree: ast.Module) -> Iterator[tuple[ast.AST, str]]:
    """C/C++/CUDA source, read by ``cuda_code`` (comments and literals blanked, offsets kept):
    every string a kernel builder compiles (resolved as the builder resolves it, whatever it
    contains), with the string constant it is when it is one (for line numbers), else the
    call; plus string constants that look like C/C++/CUDA (docstrings are prose, not code)."""
    docstrings = _docstrings(tree)
    constants: dict[str, ast.Constant] = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in docstrings):
            constants.setdefault(node.value, node)
    seen: set[str] = set()
    for call, text in native_builds(tree).sources:
        if text not in seen:
            seen.add(text)
            yield constants.get(text, call), cuda_code(text)
    for text, node in constants.items():
        if text not in seen and any(
                marker in text for marker in ("__global__", "#include", "torch::", "at::")):
            seen.add(text)
            yield node, cuda_code(text)


def _native_line(node: ast.AST, code: str, offset: int) -> int:
    return getattr(node, "lineno", 1) + code[:offset].count("\n")


def _define_problem(expr: ast.expr, consts: dict) -> str | None:
    """Why ``compile_kernels(defines=expr)`` could carry code into the kernel, else None.

    A value known from the source is checked as compile_kernels checks it. A value computed at
    run time (class attributes, ints computed in Python) is checked there, numbers only, so
    the source is refused only where it builds text: str()/format()/join, a string inside an
    f-string's field, an f-string other than ``f"NAME={number}"``.
    """
    from multiminddev.env import inline_build

    value = inline_build._static_value(expr, consts)
    if value is not inline_build._UNKNOWN:
        try:
            define_options(value)
        except (ValueError, TypeError) as exc:
            return str(exc).split(":")[0]
        return None
    for node in ast.walk(expr):
        func = node.func if isinstance(node, ast.Call) else None
        if (isinstance(func, ast.Name) and func.id in DEFINE_TEXT_BUILDERS) or (
                isinstance(func, ast.Attribute) and func.attr in DEFINE_TEXT_METHODS):
            return f"builds text with `{ast.unparse(func)}`"
        if isinstance(node, ast.FormattedValue) and isinstance(
                inline_build._static_value(node.value, consts), str):
            return f"field `{ast.unparse(node.value)}` is a string"
        if isinstance(node, ast.JoinedStr) and not _numeric_fstring(node):
            return f"entry `{ast.unparse(node)}` is not f\"NAME={{number}}\""
    return None


def _numeric_fstring(node: ast.JoinedStr) -> bool:
    """``f"TILE={self.tile}"``: a literal ``NAME=`` then one plain field with no text in it."""
    if len(node.values) != 2:
        return False
    head, field_ = node.values
    return (isinstance(head, ast.Constant) and isinstance(head.value, str)
            and DEFINE_FSTRING_HEAD.fullmatch(head.value) is not None
            and isinstance(field_, ast.FormattedValue) and field_.conversion == -1
            and field_.format_spec is None
            and not any(isinstance(n, ast.JoinedStr) or (
                isinstance(n, ast.Constant) and isinstance(n.value, str))
                for n in ast.walk(field_.value)))


def _native_build_findings(tree: ast.Module) -> list[Finding]:
    """load_inline arguments: static, allowlisted flags only, bound functions not libc's;
    compile_kernels defines that cannot carry code."""
    from multiminddev.env import inline_build

    builds = native_builds(tree)
    findings = [_finding(
        "native_source_not_static", RejectReason.FORBIDDEN_IMPORT,
        "load_inline arguments are computed at run time; pass string literals or module-level "
        "string constants (joined with + at most) for the sources, functions and flags, so "
        "they can be checked before anything builds", call) for call in builds.not_static]
    for call, arg, flag in builds.flags:
        if arg == "extra_include_paths" and flag.strip():
            findings.append(_finding(
                "native_build_flag", RejectReason.FORBIDDEN_IMPORT,
                f"extra_include_paths `{flag}`: a kernel build needs no include path beyond "
                "torch's and CUDA's; leave it out", call))
        elif arg == "extra_ldflags" and flag.strip():
            findings.append(_finding(
                "native_build_flag", RejectReason.FORBIDDEN_IMPORT,
                f"extra_ldflags `{flag}`: no library may be linked (vendor libraries compute "
                "with kernels that are not yours); leave extra_ldflags empty", call))
        elif arg in ("extra_cflags", "extra_cuda_cflags") and flag.strip() and not all(
                SAFE_FLAG.fullmatch(part) for part in flag.split()):
            findings.append(_finding(
                "native_build_flag", RejectReason.FORBIDDEN_IMPORT,
                f"{arg} `{flag}` is not allowed (allowed: -O0..-O3, -std=c++NN, -lineinfo, "
                "-use_fast_math, -arch/-gencode, -maxrregcount, -Xptxas -v, warnings); no "
                "-D/-U/-I/-l/-L/-Wl,/-include/-x", call))
    consts = inline_build._module_constants(tree)
    for call, expr in builds.defines:
        problem = _define_problem(expr, consts)
        if problem is not None:
            findings.append(_finding(
                "native_build_flag", RejectReason.FORBIDDEN_IMPORT,
                f"compile_kernels(defines=...) {problem}: defines are names and numbers "
                "(\"TILE=32\", {\"TILE\": self.TILE}); write code in the kernel source", call))
    aliases = import_aliases(tree)
    for call, text in builds.sources:
        # Token pasting builds identifiers the rules above never see whole
        # (``GLUE(sys, tem)("ls")``); host C++ has no need of it.
        if _is_load_inline(call, aliases) and TOKEN_PASTE.search(cuda_code(text)):
            findings.append(_finding(
                "native_token_paste", RejectReason.FORBIDDEN_IMPORT,
                "load_inline source pastes tokens with `##`, which builds names the checks "
                "cannot read; write each name out", call))
    for call, name in builds.functions:
        code = f"{name}("
        for rule, reason, pattern in NATIVE_RULES:
            if pattern.search(code):
                findings.append(_finding(rule, reason, f"load_inline binds `{name}` as a "
                                         "function: bind your own wrapper functions only", call))
    return findings


def check_native_code(tree: ast.Module, source: str) -> list[Finding]:
    """Rules for the C++/CUDA strings (load_inline wrappers run natively, unseen by Python).

    Rationale: KernelBench / Sakana load_inline candidates whose C++ wrapper simply returns
    ``torch::matmul(a, b)`` (the torch fallback moved into C++), launch on a side stream
    obtained with ``at::cuda::getStreamFromPool()``, or call ``system()`` / ``fopen()``, which no
    audit hook sees.
    """
    findings = _native_build_findings(tree)
    findings += include_rules.native_source_findings(native_builds(tree).sources)
    for node, code in _native_sources(tree):
        for rule, reason, pattern in NATIVE_RULES:
            match = pattern.search(code)
            if match:
                findings.append(Finding(rule=rule, reason=reason,
                                        line=_native_line(node, code, match.start()),
                                        message=f"native code uses `{match.group(0).strip()}`"))
        compute = [m for m in _ATEN_CALL.finditer(code) if m.group(1) not in NATIVE_ALLOWED_ATEN]
        compute += list(_TENSOR_COMPUTE_METHOD.finditer(code))
        if compute:
            first = min(compute, key=lambda m: m.start())
            what = ", ".join(sorted({m.group(0).rstrip("( ") for m in compute}))
            findings.append(Finding(rule="native_torch_compute", reason=RejectReason.TORCH_COMPUTE,
                                    line=_native_line(node, code, first.start()),
                                    message=f"native code calls torch ops ({what}); compute in "
                                            "your kernel"))
    return findings


def check_tensor_method_values(tree: ast.Module, source: str) -> list[Finding]:
    """No tensor method taken as a value in forward: ``f = x.clamp; f(min=0)``,
    ``getattr(x, "clamp")(min=0)``, ``helper(x.add_)``.

    Rationale: ``check_torch_compute`` reads calls of tensor methods; a bound method stored,
    passed on or fetched with ``getattr`` and called later runs the same torch compute under a
    name the call rule cannot see. Views, shape queries and plain attributes stay allowed.
    """
    info = _analyse_cached(source)
    parents = _parents(tree)
    findings = []
    for scope, node in _walk_scopes(info):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
                and node.attr not in TENSOR_VALUE_ATTRIBUTES
                and not _called_here(node, parents)
                and is_tensor_expr(node.value, scope.tensors, info)):
            name = node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id == "getattr" and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and node.args[1].value not in TENSOR_VALUE_ATTRIBUTES
              and is_tensor_expr(node.args[0], scope.tensors, info)):
            name = node.args[1].value
        else:
            continue
        findings.append(_finding(
            "torch_compute", RejectReason.TORCH_COMPUTE,
            f"tensor method `.{name}` taken as a value in forward (torch compute under another "
            "name); call only allocation, view and shape methods, and compute in your kernel",
            node))
    return _dedup(findings)


def _called_here(node: ast.Attribute, parents: dict[int, ast.AST]) -> bool:
    parent = parents.get(id(node))
    return isinstance(parent, ast.Call) and parent.func is node


def check_dynamic_torch_access(tree: ast.Module, source: str) -> list[Finding]:
    """No ``getattr(torch, ...)``-style access to torch functions in forward.

    Rationale: a computed attribute name (``getattr(torch, "mat" + "mul")``) would hide torch
    compute from ``check_torch_compute``.
    """
    info = _analyse_cached(source)
    findings = []
    for _, node in _walk_scopes(info):
        if (isinstance(node, ast.Call) and _dotted(node.func) == "getattr" and node.args
                and (resolve(node.args[0], info.aliases) or "").startswith("torch")):
            findings.append(_finding("dynamic_torch_access", RejectReason.TORCH_COMPUTE,
                                     "getattr on torch in forward", node))
    return findings


def _dedup(findings: Iterable[Finding]) -> list[Finding]:
    seen, out = set(), []
    for f in findings:
        key = (f.rule, f.line) if f.line is not None else (f.rule, f.message)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


CheckFn = Callable[[ast.Module, str], list[Finding]]

CHECKS: tuple[CheckFn, ...] = (
    check_syntax,
    check_model_new,
    check_kernel_defined_and_launched,
    check_torch_compute,
    check_tensor_method_values,
    check_dynamic_torch_access,
    check_reference_use,
    check_try_except_fallback,
    check_concurrency,
    check_finalizers,
    check_monkey_patch,
    check_file_access,
    check_pointer_cache,
    check_forbidden_import,
    check_torch_attributes,
    check_builtins,
    check_attribute_names,
    check_name_reads,
    check_module_overrides,
    check_definitions_resolve,
    check_host_reads,
    check_returns_input,
    check_native_code,
)


def _run_check(check: Callable[..., list[Finding]], tree: ast.Module, source: str) -> list[Finding]:
    """A check that crashes on some source rejects it (a hole would be worse) and says so."""
    try:
        return check(tree, source)
    except (RecursionError, MemoryError, ValueError, TypeError, AttributeError) as exc:
        name = getattr(check, "__name__", None) or getattr(check.func, "__name__", "check")
        return [Finding(rule=f"checker_error:{name}", reason=RejectReason.OTHER,
                        message=f"the static checker could not analyse this source "
                                f"({type(exc).__name__}: {exc}); simplify the code")]


def candidate_kind(tree: ast.Module) -> str:
    """"nvrtc" when the candidate compiles with compile_kernels, "load_inline" for load_inline."""
    aliases = import_aliases(tree)
    names = {resolve(n.func, aliases) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    if names & {"multiminddev.cuda.compile_kernels", "multiminddev.cuda.kernels.compile_kernels"}:
        return "nvrtc"
    if names & {"torch.utils.cpp_extension.load_inline", "torch.utils.cpp_extension.load"}:
        return "load_inline"
    return "unknown"


def run_static_checks(source: str, *, problem_dtype: str = "float32") -> StaticCheckResult:
    """Run every check; FAILED with all findings when any fires.

    Findings are ordered by ``REASON_PRIORITY`` (most specific hack class first), then line.
    """
    try:
        tree = pyast.parse(source)
    except SyntaxError as exc:
        finding = Finding(rule="syntax", reason=RejectReason.SYNTAX, line=exc.lineno,
                          message=f"not valid Python: {exc.msg}")
        return StaticCheckResult(status=StageStatus.FAILED, findings=[finding])
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, absurd nesting
        finding = Finding(rule="syntax", reason=RejectReason.SYNTAX,
                          message=f"not parseable Python: {type(exc).__name__}: {exc}")
        return StaticCheckResult(status=StageStatus.FAILED, findings=[finding])
    findings: list[Finding] = []
    checks = (*CHECKS, functools.partial(check_precision_downgrade, problem_dtype=problem_dtype))
    for check in checks:
        findings.extend(_run_check(check, tree, source))
        if findings and check is check_syntax:
            break  # later checks assume a compilable module
    rank = {reason: i for i, reason in enumerate(REASON_PRIORITY)}
    findings.sort(key=lambda f: (rank.get(f.reason, len(rank)), f.line or 0, f.rule))
    return StaticCheckResult(
        status=StageStatus.FAILED if findings else StageStatus.OK,
        findings=findings,
        candidate_kind=candidate_kind(tree),
    )
