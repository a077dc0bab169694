"""Materialize a mutant: copy the Triton kernel modules, replace the one marked statement, import the copy.

The copy lives in a cache directory as package faverify_mutant_<name>, the copied modules in their family
folders; its imports of copied modules are the copy's, the other modules (common.py, configs.py, ...) are
shared with the real kernels (no mutant touches them).
"""
from __future__ import annotations

import hashlib
import importlib
import os
import re
import sys
from pathlib import Path

from faverify.kernels.mutants.catalog import BY_NAME, Mutant

KERNELS = Path(__file__).resolve().parent.parent / "triton"
# the copied modules, by path below kernels/triton (a family's modules keep their folder); the other modules
# (common.py, configs.py, hopper/layouts.py, ...) are the real kernels' (no mutant touches them)
_FILES = ("dense/forward.py", "dense/backward.py", "hopper/forward.py", "hopper/backward.py",
          "hopper/backward_fused.py", "interface.py", "variant/forward.py", "variant/decode.py", "variant/backward.py",
          "variant/interface.py", "sparse.py", "fp8.py")
_MODULES = frozenset(f[:-len(".py")].replace("/", ".") for f in _FILES)  # "dense.forward", ...
# a from-import of kernels/triton: the module below it ("" for the package itself) and the names imported,
# on the line or in parentheses over several (comments and all)
_IMPORT = re.compile(r"^(\s*from )faverify\.kernels\.triton((?:\.\w+)*)( import )(\((?:[^)#]|#[^\n]*)*\)|[^\n]*)", re.M)


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
    """The mutated copies of the kernel modules, by path below kernels/triton. Raises if the mutant no longer
    applies (its site is gone or the result does not parse): a mutant that does not change the code would
    survive for nothing, and one that breaks the syntax would be "killed" by the worker that cannot import it."""
    if mutant.file not in _FILES:  # its file would not be copied: the mutant would run the real code
        raise RuntimeError(f"mutant {mutant.name}: kernels/triton/{mutant.file} is not among the copied modules "
                           f"(kernels/mutants/build.py, _FILES)")
    package = _package(mutant)
    out = {}
    for name in _FILES:
        text = (KERNELS / name).read_text()
        text = _imports_of_the_copy(text, package)
        if name == mutant.file:
            text = mutate(text, mutant)
            try:
                compile(text, name, "exec")
            except SyntaxError as e:
                raise RuntimeError(f"mutant {mutant.name}: kernels/triton/{name} no longer parses after the "
                                   f"replacement ({e.msg}, line {e.lineno}); update kernels/mutants/catalog.py")
        out[name] = text
    return out


def _imports_of_the_copy(text: str, package: str) -> str:
    """The module's text with each import of a copied module taken from the copy: `from
    faverify.kernels.triton.variant.forward import x` and `from faverify.kernels.triton.dense import forward
    as _fwd` alike. Raises on a from-import that names copied and shared modules together."""
    def local(m: re.Match) -> str:
        module = m[2].lstrip(".")
        listed = re.sub(r"#[^\n]*", "", m[4]).strip("() \n")
        names = [n.split(" as ")[0].strip() for n in listed.split(",") if n.strip()]
        copied = [f"{module}.{n}".lstrip(".") in _MODULES for n in names]
        if module in _MODULES or (copied and all(copied)):
            return f"{m[1]}{package}{m[2]}{m[3]}{m[4]}"
        if any(copied):
            raise RuntimeError(f"kernels/mutants/build.py: `{m[0].strip()}` imports copied and shared modules "
                               "together; import the copied ones on a line of their own")
        return m[0]
    return _IMPORT.sub(local, text)


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
    digest = hashlib.sha256("".join(f + files[f] for f in _FILES).encode()).hexdigest()[:16]
    root = _cache_root() / digest
    target = root / package
    if not target.exists():
        tmp = root / (package + f".tmp{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "__init__.py").write_text(f'"""Mutant {mutant.name}: {mutant.bug}."""\n')
        for folder in {Path(f).parent for f in files} - {Path(".")}:  # a family's folder: a package of the copy
            (tmp / folder).mkdir(exist_ok=True)
            (tmp / folder / "__init__.py").write_text(f'"""Mutant {mutant.name}: kernels/triton/{folder}."""\n')
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
