"""dtype names used on the command line and in cases, and the unit roundoff the tolerances scale by."""
from __future__ import annotations

import torch

from faverify.errors import UsageError

TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
NAME = {v: k for k, v in TORCH.items()}
# Unit roundoff u = 2^-p of each format (p = significand bits): the size of one rounding.
UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11, "fp32": 2.0**-24}
# The unit of the tolerance floor. In bf16/fp16 one rounding of the inputs' precision dominates everything
# a kernel does in fp32. In fp32 nothing dominates: a tiled kernel rounds each term many times (a rescale
# per key block, exp2 approximations of a few ulp, blocked sums), so the floor allows 64 fp32 roundings.
FLOOR_UNIT = {"bf16": 2.0**-8, "fp16": 2.0**-11, "fp32": 2.0**-18}


def parse_dtypes(text: str, *, argument: str = "--dtype") -> tuple[str, ...]:
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    if not names:
        raise UsageError(argument, text, "give at least one of bf16, fp16, fp32")
    for n in names:
        if n not in TORCH:
            raise UsageError(argument, n, "each dtype must be one of bf16, fp16, fp32")
    return tuple(dict.fromkeys(names))


def parse_fuzz_dtypes(text: str) -> tuple[tuple[str, ...], bool]:
    """fuzz's --dtype: (the dtypes, whether every case is an FP8 case). fp8, given alone, stands for FP8
    cases, whose output is bf16; FP8 cases are drawn beside bf16 ones wherever a subject declares fp8."""
    if "fp8" not in (t.strip() for t in text.split(",")):
        return parse_dtypes(text), False
    if [t.strip() for t in text.split(",") if t.strip()] != ["fp8"]:
        raise UsageError("--dtype", text, "fp8 is given alone (FP8 cases are drawn beside bf16 ones where a "
                                          "subject declares fp8)")
    return ("bf16",), True
