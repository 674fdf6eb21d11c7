"""Parse ``extern "C" __global__`` kernel signatures into typed parameter lists.

Argument conversion at launch time comes from these types, so a wrong argument (a float where
a pointer belongs, a half tensor for a ``float*``) is a clear ``KernelArgumentError``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# scalar C type -> numpy dtype name
SCALAR_TYPES = {
    "bool": "bool",
    "char": "int8",
    "signed char": "int8",
    "unsigned char": "uint8",
    "short": "int16",
    "unsigned short": "uint16",
    "int": "int32",
    "signed": "int32",
    "unsigned": "uint32",
    "unsigned int": "uint32",
    "long": "int64",
    "long int": "int64",
    "unsigned long": "uint64",
    "long long": "int64",
    "long long int": "int64",
    "unsigned long long": "uint64",
    "int8_t": "int8",
    "uint8_t": "uint8",
    "int16_t": "int16",
    "uint16_t": "uint16",
    "int32_t": "int32",
    "uint32_t": "uint32",
    "int64_t": "int64",
    "uint64_t": "uint64",
    "size_t": "uint64",
    "ptrdiff_t": "int64",
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "__half": "float16",
}

# pointee C type -> torch dtype names it may point at (None: any)
POINTEE_TORCH_DTYPES: dict[str, tuple[str, ...] | None] = {
    "float": ("float32",),
    "float2": ("float32",),
    "float4": ("float32",),
    "double": ("float64",),
    "half": ("float16",),
    "__half": ("float16",),
    "half2": ("float16",),
    "__half2": ("float16",),
    "__nv_bfloat16": ("bfloat16",),
    "nv_bfloat16": ("bfloat16",),
    "__nv_bfloat162": ("bfloat16",),
    "int": ("int32",),
    "int32_t": ("int32",),
    "unsigned int": ("int32", "uint32"),
    "uint32_t": ("int32", "uint32"),
    "long": ("int64",),
    "long long": ("int64",),
    "int64_t": ("int64",),
    "bool": ("bool",),
    "char": ("int8", "uint8", "bool"),
    "unsigned char": ("uint8", "bool"),
    "uint8_t": ("uint8", "bool"),
    "int8_t": ("int8",),
    "short": ("int16",),
    "int16_t": ("int16",),
    "void": None,
}

_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "struct"}


@dataclass(frozen=True)
class KernelParam:
    name: str
    c_type: str  # base type without qualifiers / stars, e.g. "float"
    is_pointer: bool

    @property
    def numpy_dtype(self) -> str | None:
        return None if self.is_pointer else SCALAR_TYPES.get(self.c_type)


@dataclass(frozen=True)
class KernelSignature:
    name: str
    params: tuple[KernelParam, ...]

    def describe(self) -> str:
        args = ", ".join(f"{p.c_type}{'*' if p.is_pointer else ''} {p.name}" for p in self.params)
        return f"{self.name}({args})"


_COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_KERNEL_RE = re.compile(
    r'extern\s+"C"\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?__global__\s+'
    r"(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+"
    r"(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(([^)]*)\)",
    re.DOTALL,
)
_BLOCK_RE = re.compile(r'extern\s+"C"\s*\{(.*?)\n\}', re.DOTALL)
_GLOBAL_IN_BLOCK_RE = re.compile(
    r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+"
    r"(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(([^)]*)\)",
    re.DOTALL,
)


def parse_param(text: str) -> KernelParam:
    text = re.sub(r"\s+", " ", text.strip())
    text = re.sub(r"\[\s*\]$", "", text)  # float x[] -> pointer
    is_pointer = "*" in text or text.endswith("[]")
    tokens = text.replace("*", " * ").split()
    tokens = [t for t in tokens if t not in _QUALIFIERS]
    name = tokens[-1] if len(tokens) > 1 and tokens[-1] != "*" else ""
    type_tokens = [t for t in tokens[:-1] if t != "*"] if name else [t for t in tokens if t != "*"]
    c_type = " ".join(type_tokens)
    c_type = c_type.replace("std::", "").replace("cuda::", "")
    return KernelParam(name=name, c_type=c_type, is_pointer=is_pointer)


def parse_kernel_signatures(source: str) -> dict[str, KernelSignature]:
    """All ``extern "C" __global__`` kernels in ``source`` with their parameters."""
    clean = _COMMENT_RE.sub("", source)
    found: dict[str, KernelSignature] = {}
    matches = list(_KERNEL_RE.finditer(clean))
    for block in _BLOCK_RE.finditer(clean):
        matches.extend(_GLOBAL_IN_BLOCK_RE.finditer(block.group(1)))
    for match in matches:
        name, params_text = match.group(1), match.group(2).strip()
        params: tuple[KernelParam, ...] = ()
        if params_text and params_text != "void":
            params = tuple(parse_param(p) for p in params_text.split(","))
        found[name] = KernelSignature(name=name, params=params)
    return found
