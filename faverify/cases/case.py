"""A fuzz case: every parameter that decides the tensors and the call, JSON round-trippable.

Tensors are never stored in a case: inputs.make_inputs draws them from `seed`, so a case printed as
one line of JSON reproduces the same inputs on the same device.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from faverify.cases.checks import check
from faverify.cases.vocabulary import FEATURES, VARIANT_DEFAULTS
from faverify.errors import UsageError


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
    shards: str = "off"  # or cut into `splits` context-parallel shards (vocabulary.SHARDS; Case.shard_keys)
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
    fp8: str = "off"  # q, k, v in float8_e4m3fn with descale factors of this granularity (vocabulary.FP8)
    fp8_format: str = "e4m3"  # or float8_e5m2 (vocabulary.FP8_FORMATS)
    lse_grad: str = "off"  # a loss on lse as well as on out, or on lse alone (vocabulary.LSE_GRADS)
    max_logit: bool = False  # the call asks for the largest logit each row sees (return_max_logit=True)
    # sparse key indices (cases/sparse.py): what they hold (vocabulary.SPARSE) and how many a row lists
    sparse: str = "off"
    topk: int = 0
    kv_shared: bool = False  # v is k[..., :head_dim_v], a view of k's own storage (MLA's absorbed form)
    # a call sequence (`fuzz --sequence`): the calls this process makes before this one, oldest first, each
    # a case of its own with no `before`; every call is judged, so a bug carried from one call into the next
    # (a compile cache keyed too loosely, a scratch buffer never cleared) fails the call it reaches
    before: tuple = ()

    def __post_init__(self) -> None:
        if isinstance(self.before, list):  # JSON gives lists of objects
            object.__setattr__(self, "before", tuple(self.before))
        check(self)

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
              "shards": self.shards != "off",
              "mask": self.mask != "off", "mask_nan": self.mask_nan, "bias": self.bias != "off",
              "bias_grad": self.bias_grad, "score_mod": self.score_mod != "off", "fp8": self.fp8 != "off",
              "lse_grad": self.lse_grad != "off", "max_logit": self.max_logit, "sparse": self.sparse != "off",
              "kv_shared": self.kv_shared}
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

    def shard_keys(self, seqlen_k: int) -> list:
        """Each shard's keys of one sequence of seqlen_k keys, a range of their indices (vocabulary.SHARDS)."""
        if self.shards == "interleaved":
            return [range(s, seqlen_k, self.splits) for s in range(self.splits)]
        per = max(1, -(-seqlen_k // self.splits))
        return [range(min(seqlen_k, s * per), min(seqlen_k, (s + 1) * per)) for s in range(self.splits)]

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
        if self.before:  # each earlier call as its own JSON, its variant fields left out when off
            d["before"] = [c.to_dict() for c in self.before]
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
        if isinstance(data.get("before"), (list, tuple)):
            data = {**data, "before": tuple(cls.from_dict(c) for c in data["before"])}
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
            flags.append("varlen " + ",".join(f"{a}/{b}" for a,
                                              b in self.seqlens) + (f" tail={self.tail}" if self.tail else ""))
        if self.cache_seqlens is not None:
            cache = ",".join(map(str, self.cache_seqlens))
            flags.append(f"paged cache={cache} page={self.page_size} pages={self.pages}"
                         + (f" pool={self.pool}" if self.pool else ""))
        if self.splits > 1:
            flags.append(f"splits={self.splits}" if self.shards == "off" else f"{self.shards} shards={self.splits}")
        flags += self._mask_flags()
        if self.fp8 != "off":
            flags.append(f"fp8 {self.fp8_format} descale per {self.fp8}")
        if self.lse_grad != "off":
            flags.append("loss on lse" + (" alone" if self.lse_grad == "alone" else " and out"))
        if self.max_logit:
            flags.append("max_logit")
        if self.sparse != "off":
            flags.append(f"sparse={self.sparse} topk={self.topk}")
        if self.kv_shared:
            flags.append("v=k[..., :dv] (kv_shared)")
        calls = f"after {len(self.before)} call{'s' if len(self.before) > 1 else ''}: " if self.before else ""
        return (f"{calls}b{self.batch} sq{self.seqlen_q} sk{self.seqlen_k} h{self.nheads}{gqa} d{self.head_dim} "
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
