"""Materialize a mutant: copy the Triton kernel modules, apply the one replacement, import the copy.

The copy lives in a cache directory as package faverify_mutant_<name>; common.py and configs.py are
shared with the real kernels (no mutant touches them).
"""
from __future__ import annotations

import hashlib
import importlib
import os
import sys
from pathlib import Path

from faverify.kernels.mutants.catalog import BY_NAME, Mutant

_SOURCE = Path(__file__).resolve().parent.parent / "triton"
_FILES = ("forward.py", "forward_hopper.py", "backward.py", "interface.py")


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "faverify" / "mutants"


def source(mutant: Mutant) -> dict:
    """The mutated copies of the kernel modules, by file name. Raises if the replacement no longer applies
    (the real kernels changed): a mutant that does not change the code would survive for nothing."""
    package = _package(mutant)
    out = {}
    for name in _FILES:
        text = (_SOURCE / name).read_text()
        text = text.replace("from faverify.kernels.triton import backward as _bwd",
                            f"from {package} import backward as _bwd")
        text = text.replace("from faverify.kernels.triton import forward as _fwd",
                            f"from {package} import forward as _fwd")
        text = text.replace("from faverify.kernels.triton import forward_hopper as _fwd_hopper",
                            f"from {package} import forward_hopper as _fwd_hopper")
        if name == mutant.file:
            count = text.count(mutant.old)
            if count != 1:
                raise RuntimeError(f"mutant {mutant.name}: its text occurs {count} times in kernels/triton/{name} "
                                   "(must be exactly once); update kernels/mutants/catalog.py")
            text = text.replace(mutant.old, mutant.new)
            try:  # a replacement that breaks the syntax would be "killed" by the worker that cannot import it
                compile(text, name, "exec")
            except SyntaxError as e:
                raise RuntimeError(f"mutant {mutant.name}: kernels/triton/{name} no longer parses after the "
                                   f"replacement ({e.msg}, line {e.lineno}); update kernels/mutants/catalog.py")
        out[name] = text
    return out


def _package(mutant: Mutant) -> str:
    return "faverify_mutant_" + mutant.name.replace("-", "_")


def load(name: str):
    """The mutant's flash_attn_func."""
    if name not in BY_NAME:
        raise KeyError(name)
    mutant = BY_NAME[name]
    package = _package(mutant)
    if package in sys.modules:
        return sys.modules[package + ".interface"].flash_attn_func
    files = source(mutant)
    digest = hashlib.sha256("".join(files[f] for f in _FILES).encode()).hexdigest()[:16]
    root = _cache_root() / digest
    target = root / package
    if not target.exists():
        tmp = root / (package + f".tmp{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "__init__.py").write_text(f'"""Mutant {mutant.name}: {mutant.bug}."""\n')
        for f, text in files.items():
            (tmp / f).write_text(text)
        try:
            tmp.rename(target)
        except OSError:  # another process made it first: same content
            pass
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    return importlib.import_module(package + ".interface").flash_attn_func
