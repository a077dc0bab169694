"""Materialize a mutant: copy the Triton kernel modules, replace the one marked statement, import the copy.

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

KERNELS = Path(__file__).resolve().parent.parent / "triton"
_FILES = ("forward.py", "forward_hopper.py", "backward.py", "backward_hopper.py", "backward_fused_hopper.py",
          "interface.py", "variant_forward.py", "variant_decode.py", "variant_backward.py", "variant_interface.py",
          "sparse.py", "fp8.py")


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "faverify" / "mutants"


MARKER = "[mutant site: {}]"


def mutate(text: str, mutant: Mutant) -> str:
    """The file's text with the statement on the line marked `[mutant site: SITE]` (or on the line below a
    comment line that holds the marker alone) replaced by the mutant's code (several lines take the marked
    line's indentation; empty code deletes the line). The marker, not
    the statement's exact text, anchors the mutant: reformatting the kernels leaves it applicable."""
    marker = MARKER.format(mutant.site)
    lines = text.split("\n")
    marked = [i for i, line in enumerate(lines) if marker in line]
    if len(marked) != 1:
        raise RuntimeError(f"mutant {mutant.name}: {marker} marks {len(marked)} lines of kernels/triton/{mutant.file} "
                           "(must be exactly one); update kernels/mutants/catalog.py or the marker")
    i = marked[0]
    if lines[i].lstrip().startswith("#"):  # a marker on a line of its own marks the statement below it
        i += 1
    line = lines[i]
    indent = line[:len(line) - len(line.lstrip())]
    code = (line[:line.rindex("#", 0, line.index(marker))] if marker in line else line.split("  #")[0]).strip()
    if code == mutant.new:
        raise RuntimeError(f"mutant {mutant.name}: its code is the marked statement's own; it would change nothing")
    lines[i:i + 1] = [indent + part for part in mutant.new.split("\n")] if mutant.new else []
    return "\n".join(lines)


def source(mutant: Mutant) -> dict:
    """The mutated copies of the kernel modules, by file name. Raises if the mutant no longer applies (its
    site is gone or the result does not parse): a mutant that does not change the code would survive for
    nothing, and one that breaks the syntax would be "killed" by the worker that cannot import it."""
    if mutant.file not in _FILES:  # its file would not be copied: the mutant would run the real code
        raise RuntimeError(f"mutant {mutant.name}: kernels/triton/{mutant.file} is not among the copied modules "
                           f"(kernels/mutants/build.py, _FILES)")
    package = _package(mutant)
    out = {}
    for name in _FILES:
        text = (KERNELS / name).read_text()
        for module in ("backward as _bwd", "backward_hopper as _bwd_hopper", "backward_fused_hopper as _bwd_fused",
                       "forward as _fwd",
                       "forward_hopper as _fwd_hopper",
                       "variant_forward as _vfwd", "variant_decode as _vdec", "variant_backward as _vbwd",
                       "variant_interface as _var", "sparse as _sparse"):
            text = text.replace(f"from faverify.kernels.triton import {module}", f"from {package} import {module}")
        text = text.replace("from faverify.kernels.triton.variant_forward import",
                            f"from {package}.variant_forward import")
        if name == mutant.file:
            text = mutate(text, mutant)
            try:
                compile(text, name, "exec")
            except SyntaxError as e:
                raise RuntimeError(f"mutant {mutant.name}: kernels/triton/{name} no longer parses after the "
                                   f"replacement ({e.msg}, line {e.lineno}); update kernels/mutants/catalog.py")
        out[name] = text
    return out


def _package(mutant: Mutant) -> str:
    return "faverify_mutant_" + mutant.name.replace("-", "_")


def load(name: str, module: str = "interface"):
    """The mutant's copy of a kernel module: interface (its flash_attn_func, flash_attn_varlen_func,
    flash_attn_with_kvcache) unless named."""
    if name not in BY_NAME:
        raise KeyError(name)
    mutant = BY_NAME[name]
    package = _package(mutant)
    if package in sys.modules:
        return importlib.import_module(f"{package}.{module}")
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
    return importlib.import_module(f"{package}.{module}")
