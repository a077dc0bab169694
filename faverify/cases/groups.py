"""The feature groups of a Case: fields that mean something only together, each group None on a case that
leaves its feature off. A case's JSON keeps them flat (each group's FLAT keys, left out at their off values),
so a saved case reads as it always has; Case.of builds the groups from those keys."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from faverify.cases.vocabulary import VARIANT_DEFAULTS


@dataclass(frozen=True)
class Varlen:
    """Sequences of their own lengths, packed along the token axis; the case's batch, seqlen_q and seqlen_k
    are their count and their maxima (flash-attn's max_seqlen_q, max_seqlen_k)."""

    FLAT: ClassVar[tuple] = ("seqlens", "tail")
    seqlens: tuple  # (seqlen_q, seqlen_k) per sequence
    tail: int = 0  # unused tokens of q and k past the last offset (NaN; never read nor written)


@dataclass(frozen=True)
class Paged:
    """The keys of each sequence's cache (the case's seqlen_k is their maximum), in pages of page_size tokens
    laid out in the pool per `pages` (vocabulary.PAGE_ORDERS)."""

    FLAT: ClassVar[tuple] = ("cache_seqlens", "page_size", "pages", "pool")
    cache_seqlens: tuple
    page_size: int
    pages: str = "in-order"
    pool: int = 0  # pages in the pool; 0: those used, and one unused


@dataclass(frozen=True)
class Mask:
    """A boolean keep-mask (masks.py draws it from the seed): the pattern (vocabulary.MASKS) and its shape; the
    block size of "block"; the percent of blocks or elements masked ("block", "random"); the lengths of
    "padding" ([q_len, k_len] per batch element), "document" ([q_len, k_len] per document, in order) and
    "prefix" ([prefix]); nan: keys that no row may see hold NaN in k and v."""

    FLAT: ClassVar[tuple] = ("mask", "mask_shape", "mask_block", "mask_rate", "mask_lengths", "mask_nan")
    pattern: str
    shape: str = "full"
    block: int = 0
    rate: int = 0
    lengths: tuple | None = None
    nan: bool = False


@dataclass(frozen=True)
class Bias:
    """An additive bias drawn from the seed: its values (vocabulary.BIASES), shape (MASK_SHAPES but "keys")
    and dtype; grad: the bias requires grad, and dbias is judged with the other gradients."""

    FLAT: ClassVar[tuple] = ("bias", "bias_shape", "bias_dtype", "bias_grad")
    values: str
    shape: str = "full"
    dtype: str = "input"
    grad: bool = False


@dataclass(frozen=True)
class FP8:
    """q, k, v in FP8 with descale factors of this granularity (vocabulary.FP8), in this format
    (vocabulary.FP8_FORMATS)."""

    FLAT: ClassVar[tuple] = ("fp8", "fp8_format")
    granularity: str
    format: str = "e4m3"


@dataclass(frozen=True)
class Sparse:
    """Sparse key indices (cases/sparse.py): what they hold (vocabulary.SPARSE) and how many a row lists."""

    FLAT: ClassVar[tuple] = ("sparse", "topk")
    indices: str
    topk: int


# each group's attribute on a Case, which is also its feature's name (vocabulary.FEATURES)
GROUPS = {"varlen": Varlen, "paged": Paged, "mask": Mask, "bias": Bias, "fp8": FP8, "sparse": Sparse}


def is_off(name: str, value: object) -> bool:
    """Is a flat field at its off value, its type too (a mask_nan of 0 is not false: the checks refuse it)."""
    off = VARIANT_DEFAULTS[name]
    return value is off or (type(value) is type(off) and value == off)


def grouped(group: type, fields: dict) -> object | None:
    """The group of the flat fields given (some of group.FLAT, the rest at their off values), or None where
    each is at its off value. A group whose first field is off, made where another is not, is the checks' to
    refuse (a page_size without cache_seqlens)."""
    if all(is_off(name, value) for name, value in fields.items()):
        return None
    return group(*(fields.get(name, VARIANT_DEFAULTS[name]) for name in group.FLAT))


def flattened(group: type, value: object | None) -> dict:
    """A group's flat fields, in FLAT order: their off values where the group is None."""
    if value is None:
        return {name: VARIANT_DEFAULTS[name] for name in group.FLAT}
    return {name: getattr(value, f.name) for name, f in zip(group.FLAT, dataclasses.fields(group))}
