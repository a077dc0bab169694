"""The groups of a subject's Capabilities: the ragged and split-KV batches it takes, its masks and biases,
its FP8 inputs. A declaration stays flat (faverify_capabilities): each group's FLAT names, in order, are its
fields' names there; Capabilities.of builds the groups from them. The checks below refuse a field that is not
valid by the name the declaration gives it, for the groups and for Capabilities alike."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, ClassVar

from faverify.cases.vocabulary import FP8, FP8_FORMATS


@dataclass(frozen=True)
class RaggedCaps:
    """Ragged and split batches (docs/design.md, "Ragged and paged"): packed varlen batches, whose gradients'
    tail rows past the last sequence it leaves "zero" (their gradient, by definition) or "finite" (as they
    were); a paged KV cache, of the page sizes listed (None: any); dense: False for varlen or paged cases only
    (flash_attn_varlen_func takes nothing else); split-KV partial results returned beside out and lse, the keys
    cut into whole blocks of split_block keys; combine: a split-KV combine alone, fn(out_splits, lse_splits)
    -> (out, lse), judged on split cases' partials, and with shards on context-parallel shards' partials too
    (Case.shards), each from a call of its own."""

    FLAT: ClassVar[tuple] = ("varlen", "varlen_tail_grads", "paged", "dense", "page_sizes", "splits",
                             "split_block", "combine", "shards")
    varlen: bool = False
    tail_grads: str = "zero"
    paged: bool = False
    dense: bool = True
    page_sizes: tuple | None = None
    splits: bool = False
    split_block: int = 1
    combine: bool = False
    shards: bool = False

    def __post_init__(self) -> None:
        if self.tail_grads not in ("zero", "finite"):
            raise ValueError(f"varlen_tail_grads must be zero or finite, got {self.tail_grads!r}")
        if self.page_sizes is not None:  # checked here, not by check_integers: the message shows the list as declared
            sizes = tuple(self.page_sizes) if isinstance(self.page_sizes, list) else self.page_sizes
            if not isinstance(sizes, tuple) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1
                                                       for n in sizes):
                raise ValueError(f"page_sizes must be a list of integers >= 1, got {self.page_sizes!r}")
            object.__setattr__(self, "page_sizes", sizes)
        check_positive(self, "split_block")
        check_flags(self, "varlen", "paged", "dense", "splits", "combine", "shards")


@dataclass(frozen=True)
class MaskCaps:
    """Masks and biases (docs/design.md, "Masks and biases"), in torch SDPA's and FlexAttention's names:
    mask: attn_mask, a bool [b|1, h|1, sq|1, sk] (True: keep); bias: attn_mask, a float one added to the
    logits, and bias_grad: its gradient (dbias, judged); mask_nan: keys no row sees may hold NaN, and must not
    reach any output; score_mod: a FlexAttention score_mod(score, b, h, q_idx, kv_idx); mask_mod: every mask
    as a FlexAttention mask_mod(b, h, q_idx, kv_idx) instead of a tensor; block_mask: block patterns as their
    blocks, block_mask bool [b|1, h|1, ceil(sq/n), ceil(sk/n)] and block_size n."""

    FLAT: ClassVar[tuple] = ("mask", "mask_nan", "bias", "bias_grad", "score_mod", "mask_mod", "block_mask")
    mask: bool = False
    nan: bool = False
    bias: bool = False
    bias_grad: bool = False
    score_mod: bool = False
    mask_mod: bool = False
    block_mask: bool = False

    def __post_init__(self) -> None:
        check_flags(self, *(f.name for f in dataclasses.fields(self)))

    def any_mask(self) -> bool:
        """Whether it takes masks in some form."""
        return self.mask or self.mask_mod or self.block_mask


@dataclass(frozen=True)
class FP8Caps:
    """FP8 inputs (cases/fp8.py): the descale granularities it takes, "tensor" and "head" (flash-attn 3's
    [batch, nheads_k] q_descale, k_descale, v_descale, passed by those keywords) and "block" (k's and v's
    [batch, nheads_k, blocks], one per FP8_BLOCK keys), none where empty; the FP8 formats it takes (e4m3, and
    e5m2 where it declares it: drawn then, beside e4m3); only: FP8 inputs alone (an FP8 kernel), every case
    drawn for it an FP8 case."""

    FLAT: ClassVar[tuple] = ("fp8", "fp8_formats", "fp8_only")
    granularities: tuple = ()
    formats: tuple = ("e4m3",)
    only: bool = False

    def __post_init__(self) -> None:
        check_names(self, "granularities", FP8[1:])
        check_names(self, "formats", tuple(FP8_FORMATS))
        check_flags(self, "only")
        if self.only and not self.granularities:
            raise ValueError("fp8_only needs fp8: the descale granularities its FP8 cases take")


GROUPS = {"ragged": RaggedCaps, "masks": MaskCaps, "fp8": FP8Caps}


def declared_name(owner: object, field: str) -> str:
    """The field's name in a declaration: a group's FLAT name for it, else the field's own."""
    flat = getattr(type(owner), "FLAT", None)
    return dict(zip((f.name for f in dataclasses.fields(owner)), flat))[field] if flat else field


def check_flags(owner: object, *fields: str) -> None:
    """Each field a bool."""
    for field in fields:
        if not isinstance(getattr(owner, field), bool):
            raise ValueError(f"{declared_name(owner, field)} must be true or false, got {getattr(owner, field)!r}")


def check_positive(owner: object, field: str) -> None:
    """The field an integer >= 1 (not a bool)."""
    value = getattr(owner, field)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{declared_name(owner, field)} must be an integer >= 1, got {value!r}")


def _as_tuple(owner: object, field: str):
    """The field's value, a list kept as a tuple (a frozen dataclass's field set in its __post_init__)."""
    value = getattr(owner, field)
    if isinstance(value, list):
        object.__setattr__(owner, field, value := tuple(value))
    return value


def check_names(owner: object, field: str, allowed: tuple) -> None:
    """The field a tuple of names among `allowed` (a list is taken as one)."""
    value = _as_tuple(owner, field)
    if not isinstance(value, tuple) or not all(isinstance(x, str) and x in allowed for x in value):
        raise ValueError(f"{declared_name(owner, field)} must be a list of {', '.join(allowed)}, got {value!r}")


def check_integers(owner: object, field: str, ok: Callable, rule: str, count: tuple | None = None) -> None:
    """The field a tuple of integers that are `ok` (a list is taken as one), of a length in `count`."""
    value = _as_tuple(owner, field)
    if not isinstance(value, tuple) or (count is not None and len(value) not in count) or not all(
            isinstance(n, int) and not isinstance(n, bool) and ok(n) for n in value):
        raise ValueError(f"{declared_name(owner, field)} must be {rule}, got {value!r}")


def split_flat(fields: dict) -> dict:
    """The flat declaration's fields with each group's FLAT names taken out and made into the group (its
    defaults for those not given)."""
    out = dict(fields)
    for name, group in GROUPS.items():
        given = {f.name: out.pop(key) for key, f in zip(group.FLAT, dataclasses.fields(group)) if key in out}
        out[name] = group(**given)
    return out


def flattened(group: object) -> dict:
    """A group's fields by their flat names, in FLAT order."""
    return {key: getattr(group, f.name) for key, f in zip(type(group).FLAT, dataclasses.fields(group))}
