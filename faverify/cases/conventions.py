"""The conventions that differ between attention libraries, which a subject declares and the FP64 reference
follows (docs/design.md, "Conventions"): where causal masks and windows align, the base of lse, the lse
of a row that sees no key, and the form of the ALiBi bias. Presets name each library's set.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

ALIGNMENTS = ("bottom-right", "top-left")
LSE_BASES = ("e", "2")
EMPTY_LSE = ("-inf", "+inf")
# flash: -a * |i + sk - sq - j|, symmetric about the diagonal; relative: a * (j - diagonal), signed, as
# FlashInfer and cuDNN add it (the same as flash on and below the diagonal)
ALIBI_FORMS = ("flash", "relative")
# the max-logit output: one per query row [b, h, sq] (cuDNN's Max, FlashMLA's max_logits), or one per head
# [h], the largest over the batch and every row (Transformer Engine's return_max_logit, what QK-clip reads)
MAX_LOGIT_SHAPES = ("row", "head")
# a key that sparse indices list twice: weighed twice, as a kernel that gathers the listed keys does
# (FlashMLA's sparse kernels), or once, as one that masks the keys not listed does
SPARSE_DUPLICATES = ("each", "once")


@dataclass(frozen=True)
class Conventions:
    causal: str = "bottom-right"
    lse_base: str = "e"
    empty_lse: str = "-inf"
    alibi: str = "flash"
    max_logit: str = "row"
    sparse_duplicates: str = "each"

    def __post_init__(self) -> None:
        for name, allowed in (("causal", ALIGNMENTS), ("lse_base", LSE_BASES), ("empty_lse", EMPTY_LSE),
                              ("alibi", ALIBI_FORMS), ("max_logit", MAX_LOGIT_SHAPES),
                              ("sparse_duplicates", SPARSE_DUPLICATES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"conventions.{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")

    def offset(self, seqlen_q: int, seqlen_k: int) -> int:
        """The key on row i's diagonal is i + offset."""
        return seqlen_k - seqlen_q if self.causal == "bottom-right" else 0

    @property
    def lse_scale(self) -> float:
        """Multiplies a natural-log lse into the declared base."""
        return 1.0 if self.lse_base == "e" else 1.0 / math.log(2.0)

    @property
    def empty_lse_value(self) -> float:
        return -math.inf if self.empty_lse == "-inf" else math.inf

    def describe(self) -> str:
        return (f"causal and windows {self.causal}, lse base {self.lse_base}, lse of a row that sees no key "
                f"{self.empty_lse}, ALiBi {self.alibi}, max logit per {self.max_logit}, a key listed twice by "
                f"sparse indices weighed {'twice' if self.sparse_duplicates == 'each' else 'once'}")

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS = {
    "flash-attn-2": Conventions(empty_lse="+inf"),
    "flash-attn-3": Conventions(),
    "flash-attn-4": Conventions(),
    "flashinfer": Conventions(lse_base="2", alibi="relative"),
    "cudnn": Conventions(alibi="relative"),
    "torch-sdpa": Conventions(causal="top-left"),
    "xformers": Conventions(causal="top-left"),
}
DEFAULT = Conventions()


def parse(value) -> Conventions:
    """A preset's name, or a dict of Conventions' fields (unnamed ones default), or a Conventions."""
    if isinstance(value, Conventions):
        return value
    if isinstance(value, str):
        if value not in PRESETS:
            raise ValueError(f"conventions preset {value!r} is unknown; presets: {', '.join(PRESETS)}")
        return PRESETS[value]
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(DEFAULT.to_dict()))
        if unknown:
            raise ValueError(f"conventions has unknown keys {unknown}; keys: {', '.join(DEFAULT.to_dict())}")
        return Conventions(**value)
    raise ValueError(f"conventions must be a preset name ({', '.join(PRESETS)}) or a dict, got {value!r}")
