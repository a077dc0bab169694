"""`mutant:NAME` subjects: the bundled Triton kernels with one seeded bug, behind the subject whose code the
bug is in. The kernels never import their mutants; the mutants import the kernels."""
from __future__ import annotations

from faverify.kernels.mutants.build import load
from faverify.kernels.mutants.catalog import BY_NAME
from faverify.kernels.triton.subject import _choose_interpreter, _wrap, fp8_subject
from faverify.subjects.base import Subject


def make_mutant(name: str) -> Subject:
    """`mutant:NAME`: the Triton kernels with one seeded bug (kernels/mutants/catalog.py), behind the
    subject whose code the bug is in."""
    _choose_interpreter()
    mutant = BY_NAME[name]
    if mutant.subject == "triton-fp8":
        return fp8_subject(f"mutant:{name}", load(name, "fp8").fp8_attn_func, f"mutant: {mutant.bug}")
    return _wrap(f"mutant:{name}", load(name), f"mutant: {mutant.bug}", mutant.subject)
