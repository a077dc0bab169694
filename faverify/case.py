"""A fuzz case: every parameter that decides the tensors and the call, JSON round-trippable.

Tensors are never stored in a case: inputs.make_inputs draws them from `seed`, so a case printed as
one line of JSON reproduces the same inputs on the same device.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

from faverify.errors import UsageError
from faverify.kernels.constants import MAX_SPLITS

DTYPES = ("bf16", "fp16", "fp32")
# inputs.py draws each; "negative" and "lone-key" make rows whose every logit is far below zero (the bugs of
# kernels with a finite -inf sentinel, or that take exp of an lse in fp32)
REGIMES = ("normal", "large", "bf16-scale", "outliers", "constant", "peaked", "tiny", "negative", "lone-key")
# "broadcast": k and v expanded over batch and kv heads (stride 0); "spread": every stride of q, k, v
# twice or more the contiguous one
LAYOUTS = ("contiguous", "transposed", "strided", "packed", "broadcast", "spread")
INITS = ("-inf", "-1e30")
MAX_HEAD_DIM = 256
MAX_HEAD_DIM_V = 512  # MLA's value head dim (576/512 for q/k and v)
MAX_SEED = 2**63
# every length, count and bound a kernel indexes with fits a signed 32-bit integer
MAX_INT = 2**31 - 1
# the largest softmax_scale and softcap: past it the logits of ordinary inputs overflow fp32
MAX_SCALE = 1e6
MAX_SEQUENCES = 1 << 16  # of a varlen or paged case
# ALiBi slopes: per head, per batch and head, or all zero (must give dense attention); drawn from the seed
ALIBI = ("off", "head", "batch-head", "zero")
# Sink logits per head, drawn from the seed: about the size of the rows' own log-sum-exp, far above every
# logit (all weight on the sink, out near 0) or far below (no weight on it)
SINKS = ("off", "around", "above", "below")
# "varlen", "paged" and "splits" change the batch's shape rather than the logits (docs/design.md, "Ragged
# and paged"): sequences of their own lengths packed along the token axis, keys in a paged cache, and the
# keys cut into split-KV partial results
VARIANT_FEATURES = ("window", "softcap", "alibi", "sinks", "head_dim_v")  # what the logits of a row are
BATCH_FEATURES = ("varlen", "paged", "splits")  # how the batch and its keys are laid out and cut
# masks and biases given as tensors or functions (docs/design.md, "Masks and biases"): a boolean keep-mask
# drawn as a pattern, masked keys holding NaN, an additive bias and its gradient, a FlexAttention score_mod
MASK_FEATURES = ("mask", "mask_nan", "bias", "bias_grad", "score_mod")
FEATURES = VARIANT_FEATURES + BATCH_FEATURES + MASK_FEATURES
# A mask's pattern: per-batch key and query lengths; documents packed in one sequence (block-diagonal);
# a prefix seen by every row, causal after it; random blocks of mask_block keys and rows; random elements
MASKS = ("off", "padding", "document", "prefix", "block", "random")
# The mask's shape, SDPA's heads-first [b, h, sq, sk] with 1 where it broadcasts: "full" [b, h, sq, sk];
# "batch" [1, h, sq, sk]; "heads" [b, 1, sq, sk]; "shared" [1, 1, sq, sk]; "keys" [b, 1, 1, sk], a key
# mask every row shares (padding, block and random patterns only)
MASK_SHAPES = ("full", "batch", "heads", "shared", "keys")
KEY_MASKS = ("padding", "block", "random")
# Bias values: N(0, 1); N(0, 1) * BIAS_LARGE; N(0, 1) with the bias dtype's finfo.min (the -inf stand-in
# many callers use) at random positions and over whole rows
BIASES = ("off", "normal", "large", "min")
BIAS_DTYPES = ("input", "fp32")
# score_mods of the FlexAttention signature (mods.py): a relative position bias table, ALiBi and softcap
SCORE_MODS = ("off", "relative", "alibi", "softcap")
# Where a paged sequence's pages lie in the pool: one after the other; the pool reversed; a random
# permutation with unused pages between them; the first sequence's full pages shared by the others (a
# cached prefix)
PAGE_ORDERS = ("in-order", "reverse", "random", "shared")
# The variant fields and their "off" values: a case that leaves them off is dense attention, and its JSON
# leaves them out, so a dense case prints as it always did.
VARIANT_DEFAULTS = {"window": (-1, -1), "softcap": 0.0, "alibi": "off", "sinks": "off", "head_dim_v": None,
                    "seqlens": None, "tail": 0, "cache_seqlens": None, "page_size": 0, "pages": "in-order",
                    "pool": 0, "splits": 1, "mask": "off", "mask_shape": "full", "mask_block": 0, "mask_rate": 0,
                    "mask_lengths": None, "mask_nan": False, "bias": "off", "bias_shape": "full",
                    "bias_dtype": "input", "bias_grad": False, "score_mod": "off"}


@dataclass(frozen=True)
class Case:
    batch: int
    seqlen_q: int
    seqlen_k: int
    nheads: int
    nheads_k: int
    head_dim: int
    dtype: str = "bf16"
    causal: bool = False
    softmax_scale: float | None = None  # None: head_dim ** -0.5
    regime: str = "normal"
    layout: str = "contiguous"
    init: str = "-inf"  # start of the running max m_i inside kernels that take it
    seed: int = 0
    # variants (docs/design.md, "Variants"): each off by default
    window: tuple = (-1, -1)  # (left, right) keys a row sees around its diagonal, -1: no bound
    softcap: float = 0.0  # c > 0: logits become c * tanh(s / c)
    alibi: str = "off"
    sinks: str = "off"
    head_dim_v: int | None = None  # None: head_dim
    # varlen: (seqlen_q, seqlen_k) per sequence, packed along the token axis; batch, seqlen_q and seqlen_k
    # are then their count and their maxima (flash-attn's max_seqlen_q, max_seqlen_k)
    seqlens: tuple | None = None
    tail: int = 0  # varlen: unused tokens of q and k past the last offset (NaN; never read nor written)
    # paged: the keys of each sequence's cache (seqlen_k is their maximum), in pages of page_size tokens
    # laid out in the pool per `pages`; the pool has `pool` pages (0: those used, and one unused)
    cache_seqlens: tuple | None = None
    page_size: int = 0
    pages: str = "in-order"
    pool: int = 0
    splits: int = 1  # split-KV: each sequence's keys cut into this many ranges (Case.split_ranges)
    # masks and biases (masks.py draws them from the seed): the pattern and its shape; the block size of
    # "block"; the percent of blocks or elements masked ("block", "random"); the lengths of "padding"
    # ([q_len, k_len] per batch element), "document" ([q_len, k_len] per document, in order) and "prefix"
    # ([prefix]); mask_nan: keys that no row may see hold NaN in k and v
    mask: str = "off"
    mask_shape: str = "full"
    mask_block: int = 0
    mask_rate: int = 0
    mask_lengths: tuple | None = None
    mask_nan: bool = False
    bias: str = "off"
    bias_shape: str = "full"  # MASK_SHAPES but "keys"
    bias_dtype: str = "input"
    bias_grad: bool = False  # the bias requires grad: dbias is judged with the other gradients
    score_mod: str = "off"

    def __post_init__(self) -> None:
        for name in ("batch", "nheads", "nheads_k", "head_dim"):
            _require_int(name, getattr(self, name), minimum=1)
        for name in ("seqlen_q", "seqlen_k"):
            _require_int(name, getattr(self, name), minimum=0)
        _require_int("seed", self.seed, minimum=0, maximum=MAX_SEED - 1)  # torch.Generator.manual_seed: 64 bits
        if self.seqlen_q == 0:
            raise UsageError("seqlen_q", 0, "must be >= 1 (a case with no query rows checks nothing)")
        if self.head_dim > MAX_HEAD_DIM:
            raise UsageError("head_dim", self.head_dim, f"must be <= {MAX_HEAD_DIM}")
        if self.nheads % self.nheads_k:
            raise UsageError("nheads_k", self.nheads_k,
                             f"number of heads in key/value must divide nheads={self.nheads}")
        for name, allowed in (("dtype", DTYPES), ("regime", REGIMES), ("layout", LAYOUTS), ("init", INITS)):
            if getattr(self, name) not in allowed:
                raise UsageError(name, getattr(self, name), f"must be one of {', '.join(allowed)}")
        if not isinstance(self.causal, bool):
            raise UsageError("causal", self.causal, "must be true or false")
        if self.softmax_scale is not None:
            s = self.softmax_scale
            if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or not 0 < s <= MAX_SCALE:
                raise UsageError("softmax_scale", s, f"must be a number in (0, {MAX_SCALE:g}], or null for "
                                                     "head_dim ** -0.5 (past it fp32 logits overflow)")
        self._check_variants()

    def _check_variants(self) -> None:
        w = self.window
        if not isinstance(w, (list, tuple)) or len(w) != 2:
            raise UsageError("window", w, "must be [left, right]")
        for side, bound in zip(("left", "right"), w):
            if isinstance(bound, bool) or not isinstance(bound, int) or not -1 <= bound <= MAX_INT:
                raise UsageError("window", f"[{side} bound of {_digits(bound)}]",
                                 f"the {side} bound must be an integer in -1..{MAX_INT} (-1: no bound)")
        object.__setattr__(self, "window", tuple(w))  # JSON gives a list
        c = self.softcap
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or not 0 <= c <= MAX_SCALE:
            raise UsageError("softcap", c, f"must be a number in [0, {MAX_SCALE:g}] (0: off; a larger cap leaves "
                                           "every logit as it is)")
        for name, allowed in (("alibi", ALIBI), ("sinks", SINKS)):
            if getattr(self, name) not in allowed:
                raise UsageError(name, getattr(self, name), f"must be one of {', '.join(allowed)}")
        if self.head_dim_v is not None:
            _require_int("head_dim_v", self.head_dim_v, minimum=1)
            if self.head_dim_v > MAX_HEAD_DIM_V:
                raise UsageError("head_dim_v", self.head_dim_v, f"must be in 1..{MAX_HEAD_DIM_V}, or null for head_dim")
        self._check_ragged()
        self._check_masks()

    def _check_masks(self) -> None:
        for name, allowed in (("mask", MASKS), ("mask_shape", MASK_SHAPES), ("bias", BIASES),
                              ("bias_shape", MASK_SHAPES[:-1]), ("bias_dtype", BIAS_DTYPES), ("score_mod", SCORE_MODS)):
            if getattr(self, name) not in allowed:
                raise UsageError(name, getattr(self, name), f"must be one of {', '.join(allowed)}")
        for name in ("mask_nan", "bias_grad"):
            if not isinstance(getattr(self, name), bool):
                raise UsageError(name, getattr(self, name), "must be true or false")
        _require_int("mask_block", self.mask_block, minimum=0)
        _require_int("mask_rate", self.mask_rate, minimum=0)
        if self.mask_rate > 100:
            raise UsageError("mask_rate", self.mask_rate, "must be a percent in 0..100")
        used = [n for n in ("mask", "bias", "score_mod") if getattr(self, n) != "off"]
        if used and (self.kind != "dense" or self.splits > 1):
            raise UsageError(used[0], getattr(self, used[0]), "is for dense cases only (not varlen, paged or split)")
        if self.mask != "off" and self.bias != "off":
            raise UsageError("bias", self.bias, "a case has a mask or a bias, not both (SDPA takes one attn_mask)")
        if self.score_mod != "off" and (self.softcap or self.alibi != "off"):
            raise UsageError("score_mod", self.score_mod, "replaces softcap and alibi: leave those off")
        if self.mask == "off":
            for name in ("mask_shape", "mask_block", "mask_rate", "mask_lengths", "mask_nan"):
                if getattr(self, name) != VARIANT_DEFAULTS[name]:
                    raise UsageError(name, getattr(self, name), "is for cases with a mask (mask is off)")
        if self.bias == "off":
            for name in ("bias_shape", "bias_dtype", "bias_grad"):
                if getattr(self, name) != VARIANT_DEFAULTS[name]:
                    raise UsageError(name, getattr(self, name), "is for cases with a bias (bias is off)")
        if self.mask_shape == "keys" and self.mask not in KEY_MASKS:
            raise UsageError("mask_shape", "keys", f"takes a key mask: mask must be one of {', '.join(KEY_MASKS)}")
        if self.mask == "block":
            _require_int("mask_block", self.mask_block, minimum=1)
        elif self.mask_block:
            raise UsageError("mask_block", self.mask_block, "is for mask \"block\" only")
        if self.mask_rate and self.mask not in ("block", "random"):
            raise UsageError("mask_rate", self.mask_rate, "is for masks \"block\" and \"random\" only")
        self._check_mask_lengths()

    def _check_mask_lengths(self) -> None:
        """padding: [q_len, k_len] per batch element; document: [q_len, k_len] per document; prefix: [n]."""
        lengths = self.mask_lengths
        if self.mask not in ("padding", "document", "prefix"):
            if lengths is not None:
                raise UsageError("mask_lengths", lengths, "is for masks padding, document and prefix only")
            return
        width = 1 if self.mask == "prefix" else 2
        rule = "[prefix]" if width == 1 else "a list of [q_len, k_len] pairs"
        if not isinstance(lengths, (list, tuple)) or not lengths or not all(
                isinstance(p, (list, tuple)) and len(p) == width for p in lengths):
            raise UsageError("mask_lengths", lengths, f"must be {rule} for mask {self.mask}"
                             if width == 2 else f"must be [[prefix]] for mask prefix")
        for pair in lengths:
            for n in pair:
                _require_int("mask_lengths", n, minimum=0)
        lengths = tuple(tuple(p) for p in lengths)
        object.__setattr__(self, "mask_lengths", lengths)
        if self.mask == "padding" and len(lengths) != self.batch:
            raise UsageError("mask_lengths", list(map(list, lengths)), f"must have one pair per batch element ({self.batch})")
        if self.mask == "padding" and any(a > self.seqlen_q or b > self.seqlen_k for a, b in lengths):
            raise UsageError("mask_lengths", list(map(list, lengths)),
                             f"each [q_len, k_len] must be within [{self.seqlen_q}, {self.seqlen_k}]")
        if self.mask == "prefix" and len(lengths) != 1:
            raise UsageError("mask_lengths", list(map(list, lengths)), "must be [[prefix]] for mask prefix")

    def _check_ragged(self) -> None:
        if self.seqlens is not None and self.cache_seqlens is not None:
            raise UsageError("seqlens", list(self.seqlens), "a case is varlen or paged, not both (cache_seqlens is set)")
        _require_int("tail", self.tail, minimum=0)
        _require_int("splits", self.splits, minimum=1)
        if self.splits > MAX_SPLITS:
            raise UsageError("splits", self.splits, f"must be in 1..{MAX_SPLITS}")
        if self.splits > 1 and self.sinks != "off":
            raise UsageError("splits", self.splits, "split-KV partials do not take sinks (a sink belongs to no key range)")
        if self.seqlens is not None:
            pairs = self.seqlens
            if not isinstance(pairs, (list, tuple)) or not pairs or not all(
                    isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs):
                raise UsageError("seqlens", pairs, "must be a non-empty list of [seqlen_q, seqlen_k] pairs")
            for pair in pairs:
                for n in pair:
                    _require_int("seqlens", n, minimum=0)
            pairs = tuple(tuple(p) for p in pairs)
            object.__setattr__(self, "seqlens", pairs)
            self._require_shape("seqlens", list(map(list, pairs)), len(pairs), max(p[0] for p in pairs),
                                max(p[1] for p in pairs))
        elif self.tail:
            raise UsageError("tail", self.tail, "is for varlen cases only (seqlens is not set)")
        if self.cache_seqlens is None:
            for name in ("page_size", "pages", "pool"):
                if getattr(self, name) != VARIANT_DEFAULTS[name]:
                    raise UsageError(name, getattr(self, name), "is for paged cases only (cache_seqlens is not set)")
            return
        lengths = self.cache_seqlens
        if not isinstance(lengths, (list, tuple)) or not lengths:
            raise UsageError("cache_seqlens", lengths, "must be a non-empty list of key counts, one per sequence")
        for n in lengths:
            _require_int("cache_seqlens", n, minimum=0)
        object.__setattr__(self, "cache_seqlens", tuple(lengths))
        self._require_shape("cache_seqlens", list(lengths), len(lengths), self.seqlen_q, max(lengths))
        _require_int("page_size", self.page_size, minimum=1)
        if self.pages not in PAGE_ORDERS:
            raise UsageError("pages", self.pages, f"must be one of {', '.join(PAGE_ORDERS)}")
        _require_int("pool", self.pool, minimum=0)
        need = self.pages_used + 1
        if self.pool and self.pool < need:
            raise UsageError("pool", self.pool, f"must be 0 or at least {need} (the pages used, and one unused)")

    def _require_shape(self, name: str, value: list, batch: int, seqlen_q: int, seqlen_k: int) -> None:
        """batch, seqlen_q and seqlen_k of a varlen or paged case are what its sequences give."""
        if batch > MAX_SEQUENCES:
            raise UsageError(name, f"[{batch} sequences]", f"must have at most {MAX_SEQUENCES} sequences (the FP64 "
                                                           "reference takes them one at a time)")
        if self.layout != "contiguous":
            raise UsageError("layout", self.layout, f"must be contiguous for a case with {name}")
        want = {"batch": batch, "seqlen_q": seqlen_q, "seqlen_k": seqlen_k}
        for field, n in want.items():
            if getattr(self, field) != n:
                raise UsageError(field, getattr(self, field), f"must be {n}, as {name} {value} gives")

    @property
    def scale(self) -> float:
        return self.head_dim ** -0.5 if self.softmax_scale is None else float(self.softmax_scale)

    @property
    def group(self) -> int:
        return self.nheads // self.nheads_k

    @property
    def dv(self) -> int:
        """The value (and output) head dim."""
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    @property
    def bounds(self) -> tuple:
        """(left, right) of the keys row i sees around its diagonal j = i + sk - sq, None where unbounded:
        causal sets right to 0 (with a window, the intersection)."""
        left, right = (None if b < 0 else b for b in self.window)
        if self.causal:
            right = 0 if right is None else min(right, 0)
        return left, right

    def features(self) -> tuple:
        """The variant features this case uses, in FEATURES order."""
        on = {"window": self.window != (-1, -1), "softcap": self.softcap > 0, "alibi": self.alibi != "off",
              "sinks": self.sinks != "off", "head_dim_v": self.head_dim_v is not None,
              "varlen": self.seqlens is not None, "paged": self.cache_seqlens is not None, "splits": self.splits > 1,
              "mask": self.mask != "off", "mask_nan": self.mask_nan, "bias": self.bias != "off",
              "bias_grad": self.bias_grad, "score_mod": self.score_mod != "off"}
        return tuple(f for f in FEATURES if on[f])

    @property
    def kind(self) -> str:
        return "varlen" if self.seqlens is not None else "paged" if self.cache_seqlens is not None else "dense"

    @property
    def sequences(self) -> tuple:
        """(seqlen_q, seqlen_k) of each sequence: a dense batch's are all the same."""
        if self.seqlens is not None:
            return self.seqlens
        if self.cache_seqlens is not None:
            return tuple((self.seqlen_q, n) for n in self.cache_seqlens)
        return ((self.seqlen_q, self.seqlen_k),) * self.batch

    def sequence(self, i: int) -> "Case":
        """Sequence i as a dense case of batch 1 (its masks, empty rows and visible keys)."""
        sq, sk = self.sequences[i]
        return dataclasses.replace(self, batch=1, seqlen_q=max(1, sq), seqlen_k=sk, seqlens=None, tail=0,
                                   cache_seqlens=None, page_size=0, pages="in-order", pool=0)

    @property
    def total_q(self) -> int:
        """Query tokens of all sequences (a varlen case's packed rows, before the tail)."""
        return sum(sq for sq, _ in self.sequences)

    @property
    def total_k(self) -> int:
        return sum(sk for _, sk in self.sequences)

    @property
    def pages_used(self) -> int:
        """Pages a paged case's sequences occupy in the pool (shared pages once)."""
        if self.cache_seqlens is None:
            return 0
        own = [-(-n // self.page_size) for n in self.cache_seqlens]
        return sum(own) - sum(self.shared_pages(b) for b in range(len(own)))

    def shared_pages(self, b: int) -> int:
        """Under pages="shared", sequence b > 0 reads its first this many pages from sequence 0's (the
        full pages both have)."""
        if self.pages != "shared" or b == 0 or self.cache_seqlens is None:
            return 0
        return min(self.cache_seqlens[0], self.cache_seqlens[b]) // self.page_size

    def split_ranges(self, seqlen_k: int, block: int = 1) -> list:
        """The key ranges [lo, hi) of the splits of one sequence of seqlen_k keys: whole blocks of `block`
        keys, ceil(blocks / splits) per split, as flash-attn cuts them; the last splits may be empty."""
        blocks = -(-seqlen_k // block)
        per = max(1, -(-blocks // self.splits)) * block
        return [(min(seqlen_k, s * per), min(seqlen_k, (s + 1) * per)) for s in range(self.splits)]

    def visible_keys(self, i: int, offset: int | None = None) -> int:
        """How many keys query row i sees (causal and windows bottom-right aligned, or around i + offset)."""
        left, right = self.bounds
        diag = i + (self.seqlen_k - self.seqlen_q if offset is None else offset)
        lo = 0 if left is None else max(0, diag - left)
        hi = self.seqlen_k - 1 if right is None else min(self.seqlen_k - 1, diag + right)
        return max(0, hi - lo + 1)

    def empty_rows(self, offset: int | None = None) -> tuple:
        """(start, stop) of the query rows that see no key when row i's diagonal key is i + offset
        (default sk - sq, bottom-right; 0 is top-left): a prefix bottom-right, where a right bound empties
        the first rows, a suffix top-left, where a left bound empties the last."""
        sq, sk = self.seqlen_q, self.seqlen_k
        if sk == 0:
            return 0, sq
        off = sk - sq if offset is None else offset
        left, right = self.bounds
        if right is not None and -off - right > 0:
            return 0, min(sq, -off - right)
        if left is not None and sk + left - off < sq:
            return max(0, sk + left - off), sq
        return 0, 0

    @property
    def masked_rows(self) -> int:
        """How many query rows see no key: always the first ones (bottom-right alignment: the last row's
        diagonal is the last key, so a left bound never empties a row, and a right bound empties the first)."""
        if self.seqlen_k == 0:
            return self.seqlen_q
        right = self.bounds[1]
        if right is None:
            return 0
        return min(self.seqlen_q, max(0, self.seqlen_q - self.seqlen_k - right))

    @property
    def has_masked_rows(self) -> bool:
        return self.masked_rows > 0

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for name, off in VARIANT_DEFAULTS.items():
            if d[name] == off:
                del d[name]
            elif name == "window" or name == "cache_seqlens":
                d[name] = list(d[name])
            elif name in ("seqlens", "mask_lengths"):
                d[name] = [list(p) for p in d[name]]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: object) -> "Case":
        if not isinstance(data, dict):
            raise UsageError("case", data, "must be a JSON object with the fields of a Case")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise UsageError("case", unknown, f"unknown field(s); a Case has {', '.join(sorted(names))}")
        required = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
        missing = sorted(required - set(data))
        if missing:
            raise UsageError("case", missing, "missing required field(s)")
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> "Case":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError("case", text[:80], f"is not valid JSON ({e.msg} at column {e.colno})") from None
        except RecursionError:
            raise UsageError("case", text[:80], "is nested too deeply to be a case") from None
        except ValueError as e:  # an integer of thousands of digits: Python refuses to convert it
            raise UsageError("case", text[:80], f"is not a case ({e})") from None
        return cls.from_dict(data)

    def short(self) -> str:
        """One readable line for tables and progress."""
        gqa = f"/{self.nheads_k}" if self.nheads_k != self.nheads else ""
        flags = [self.dtype, "causal" if self.causal else "full", self.regime, self.layout, f"init={self.init}"]
        if self.softmax_scale is not None:
            flags.append(f"scale={self.softmax_scale:g}")
        if self.window != (-1, -1):
            flags.append(f"window=({self.window[0]},{self.window[1]})")
        if self.softcap:
            flags.append(f"softcap={self.softcap:g}")
        if self.alibi != "off":
            flags.append(f"alibi={self.alibi}")
        if self.sinks != "off":
            flags.append(f"sinks={self.sinks}")
        if self.head_dim_v is not None:
            flags.append(f"dv={self.head_dim_v}")
        if self.seqlens is not None:
            flags.append("varlen " + ",".join(f"{a}/{b}" for a, b in self.seqlens) + (f" tail={self.tail}" if self.tail else ""))
        if self.cache_seqlens is not None:
            flags.append(f"paged cache={','.join(map(str, self.cache_seqlens))} page={self.page_size} pages={self.pages}"
                         + (f" pool={self.pool}" if self.pool else ""))
        if self.splits > 1:
            flags.append(f"splits={self.splits}")
        flags += self._mask_flags()
        return (f"b{self.batch} sq{self.seqlen_q} sk{self.seqlen_k} h{self.nheads}{gqa} d{self.head_dim} "
                + " ".join(flags))


    def mask_kinds(self) -> tuple:
        """What the case masks and adds by, in words ("padding mask", "min bias", "relative score_mod"): a
        run counts its cases by them."""
        return tuple(f"{value} {word}" for value, word in ((self.mask, "mask"), (self.bias, "bias"),
                                                           (self.score_mod, "score_mod")) if value != "off")

    def _mask_flags(self) -> list:
        """"padding mask [1 1, 2 0] keys" and the like: a minimal failure reads as its pattern."""
        flags = []
        if self.mask != "off":
            words = [f"{self.mask} mask"]
            if self.mask_lengths is not None:
                words.append(",".join("/".join(map(str, p)) for p in self.mask_lengths))
            if self.mask == "block":
                words.append(f"block={self.mask_block}")
            if self.mask in ("block", "random"):
                words.append(f"masked={self.mask_rate}%")
            words.append(f"shape={self.mask_shape}" + (" nan-keys" if self.mask_nan else ""))
            flags.append(" ".join(words))
        if self.bias != "off":
            flags.append(f"bias={self.bias} shape={self.bias_shape}" + (" fp32" if self.bias_dtype == "fp32" else "")
                         + (" grad" if self.bias_grad else ""))
        if self.score_mod != "off":
            flags.append(f"score_mod={self.score_mod}")
        return flags


def _digits(value) -> str:
    """A value for an error message: a huge integer by its size, not its thousands of digits."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() >= 64:
        return f"an integer of {value.bit_length()} bits"
    return repr(value)[:40]


def _require_int(name: str, value: object, *, minimum: int, maximum: int = MAX_INT) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(name, value, "must be an integer")
    if value < minimum:
        raise UsageError(name, value, f"must be >= {minimum}")
    if value > maximum:
        raise UsageError(name, value if value.bit_length() < 64 else f"an integer of {value.bit_length()} bits",
                         f"must be <= {maximum}")
