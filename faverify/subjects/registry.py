"""Name -> Subject. Built-in subjects load lazily, each module imported where it is resolved: importing the
Triton or CUDA kernels costs seconds, a library adapter imports an optional library, and the Triton
interpreter must be chosen before the kernels are defined."""
from __future__ import annotations

from typing import Callable

from faverify.errors import UsageError
from faverify.subjects import sdpa, user
from faverify.subjects.base import Subject


def _triton(kind: str) -> Subject:
    from faverify.kernels.triton.subject import make
    return make(kind)


def _flex() -> Subject:
    from faverify.subjects.flex import make
    return make()


def _combine() -> Subject:
    from faverify.subjects.combine import make
    return make()


def _library(name: str) -> Subject:
    """The adapters of kernel libraries faverify does not ship: each loads where its package imports."""
    if name in ("flash-attn", "flash-attn-3"):
        from faverify.subjects.flash_attn import make as make_flash_attn
        return make_flash_attn(name)
    if name == "flash-attn-4":
        from faverify.subjects.flash_attn_4 import make
    else:
        from faverify.subjects.flashinfer import make
    return make()


def _cuda(name: str) -> Subject:
    from faverify.kernels.cuda.subject import make
    return make(name)


_BUILTIN: dict[str, Callable[[], Subject]] = {name: (lambda n=name: sdpa.make(n)) for name in sdpa.names()}
for _name in ("triton", "triton-varlen", "triton-paged", "triton-hopper-bwd", "triton-hopper-bwd-fast",
              "triton-hopper-bwd-fused", "triton-fp8"):
    _BUILTIN[_name] = lambda n=_name: _triton(n)
_BUILTIN["flex"] = lambda: _flex()
_BUILTIN["combine"] = lambda: _combine()
for _name in ("cuda", "cuda-simt"):
    _BUILTIN[_name] = lambda n=_name: _cuda(n)
LIBRARIES = ("flash-attn", "flash-attn-3", "flash-attn-4", "flashinfer")
for _name in LIBRARIES:
    _BUILTIN[_name] = lambda n=_name: _library(n)


def builtin_names() -> tuple:
    return tuple(_BUILTIN)


def resolve(name: str) -> Subject:
    name = name.strip()
    if name in _BUILTIN:
        return _BUILTIN[name]()
    if name.startswith("mutant:"):
        from faverify.kernels.mutants.catalog import BY_NAME
        mutant = name.split(":", 1)[1]
        if mutant not in BY_NAME:
            raise UsageError("--kernel", name, f"unknown mutant; mutants: {', '.join(BY_NAME)}")
        from faverify.kernels.mutants.subject import make_mutant
        return make_mutant(mutant)
    if ":" in name:
        return user.load(name)
    raise UsageError("--kernel", name, f"unknown kernel; built-in: {', '.join(_BUILTIN)}, "
                                       "or package.module:function")


def resolve_many(text: str) -> list:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError("--kernel", text, "give at least one kernel")
    return [resolve(n) for n in dict.fromkeys(names)]
