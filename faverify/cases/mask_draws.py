"""The draw of a dense case's mask, bias and score_mod (what strategies.cases asks for when a subject
declares them): the pattern, its shape, its lengths, blocks and rates, each shrinking toward nothing masked."""
from __future__ import annotations

import hypothesis.strategies as st

from faverify.cases.vocabulary import KEY_MASKS, MASK_SHAPES

# Masks and biases: block sizes (16 first; 17 and 48 leave tails in every tile size), percents of blocks or
# elements masked (0 first: nothing masked), and the most elements a per-batch, per-head mask or bias may
# have (b * h * sq * sk): past it only the shared shapes are drawn (the FP64 dbias alone is 8 bytes each)
MASK_BLOCKS = (16, 32, 64, 128, 17, 48)
MASK_RATES = (0, 50, 25, 75, 90, 100)
MAX_DOCUMENTS = 4
MAX_MASK_ELEMENTS = 1 << 24


@st.composite
def masked(draw, features: tuple, dense: dict, variant: dict, patterns: tuple, forced: str | None = None) -> dict:
    """A mask or a bias (or neither: what it shrinks to), and a score_mod, for a dense case. Shrinking goes
    toward nothing masked: full lengths, no prefix, a masked percent of 0, one document."""
    b, h, sq, sk = dense["batch"], dense["nheads"], dense["seqlen_q"], dense["seqlen_k"]
    small = b * h * sq * sk <= MAX_MASK_ELEMENTS
    out = {}
    # eight cases in nine of a subject that declares both carry a mask or a bias (shrinks to neither)
    kinds = ["off"] + 4 * [k for k in ("mask", "bias") if k in features]
    kind = forced if forced in ("mask", "bias") else draw(st.sampled_from(kinds))
    if kind == "mask":
        # block and padding patterns twice as often: tail blocks, key masks, rows left without a key
        pattern = draw(st.sampled_from(patterns + tuple(p for p in ("block", "padding") if p in patterns
                                                        and len(patterns) > 1)))
        shapes = [s for s in (MASK_SHAPES if small else ("shared", "keys"))
                  if s != "keys" or pattern in KEY_MASKS] or ["shared"]
        if pattern in KEY_MASKS:  # a key mask where the pattern can be one
            shapes += ["keys"] * 3
        if small and b >= 2 and h >= 2:  # a mask of its own per batch element and head, where there are several
            shapes += ["full"] * 5
        out.update(mask=pattern, mask_shape=draw(st.sampled_from(shapes)))
        if pattern == "padding":
            out["mask_lengths"] = tuple((draw(_kept(sq)), draw(_kept(sk))) for _ in range(b))
        elif pattern == "document":
            n = draw(st.integers(1, MAX_DOCUMENTS))
            out["mask_lengths"] = tuple((draw(st.integers(0, sq)), draw(st.integers(0, sk))) for _ in range(n))
        elif pattern == "prefix":
            out["mask_lengths"] = ((draw(st.integers(0, sk)),),)
        if pattern == "block":
            out["mask_block"] = draw(st.sampled_from(MASK_BLOCKS))
        if pattern in ("block", "random"):
            out["mask_rate"] = draw(st.one_of(st.sampled_from(MASK_RATES), st.integers(0, 100)))
        if "mask_nan" in features:
            out["mask_nan"] = draw(st.booleans())
    elif kind == "bias":
        several = b >= 2 and h >= 2  # finfo.min at other positions per batch element and head
        out.update(bias=draw(st.sampled_from(("normal",) + ("large", "min") * 2 + (("min",) * 2 if several else ()))),
                   bias_shape=draw(st.sampled_from(MASK_SHAPES[:-1] if small else ("shared",))),
                   bias_dtype=draw(st.sampled_from(("input", "fp32"))))
        if "bias_grad" in features:  # most cases of a subject that declares it (shrinks to no gradient)
            out["bias_grad"] = draw(st.sampled_from((False, True, True, True)))
    # half the cases of a subject that declares score_mod (shrinks to none); a score_mod takes the place of
    # softcap and ALiBi, which it expresses
    if "score_mod" in features and (forced == "score_mod" or draw(st.booleans())):
        out["score_mod"] = draw(st.sampled_from(("relative", "alibi", "softcap")))
        variant.pop("softcap", None)
        variant.pop("alibi", None)
    return out


def _kept(n: int) -> st.SearchStrategy[int]:
    """A padding length in 0..n: n first (nothing padded), then the edges (none kept, one, one short)."""
    return st.one_of(st.sampled_from(list(dict.fromkeys((n, 0, 1, max(0, n - 1))))), st.integers(0, n))
