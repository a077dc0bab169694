"""A fuzz case: every parameter that decides the tensors and the call, JSON round-trippable.

Tensors are never stored in a case: inputs.make_inputs draws them from `seed`, so a case printed as
one line of JSON reproduces the same inputs on the same device.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from faverify.cases.checks import check
from faverify.cases.groups import FP8, GROUPS, Bias, Mask, Paged, Sparse, Varlen, flattened, grouped
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
    # the feature groups (groups.py), each None where its feature is off; the case's JSON holds their fields flat
    varlen: Varlen | None = None  # sequences of their own lengths packed along the token axis
    paged: Paged | None = None  # keys in a paged cache
    splits: int = 1  # split-KV: each sequence's keys cut into this many ranges (Case.split_ranges)
    shards: str = "off"  # or cut into `splits` context-parallel shards (vocabulary.SHARDS; Case.shard_keys)
    mask: Mask | None = None  # a boolean keep-mask drawn as a pattern
    bias: Bias | None = None  # an additive bias
    score_mod: str = "off"
    fp8: FP8 | None = None  # q, k, v in FP8 with descale factors
    lse_grad: str = "off"  # a loss on lse as well as on out, or on lse alone (vocabulary.LSE_GRADS)
    max_logit: bool = False  # the call asks for the largest logit each row sees (return_max_logit=True)
    sparse: Sparse | None = None  # the keys a row sees given as indices
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
              "sinks": self.sinks != "off", "head_dim_v": self.head_dim_v is not None, "splits": self.splits > 1,
              "shards": self.shards != "off", "mask_nan": self.mask is not None and self.mask.nan,
              "bias_grad": self.bias is not None and self.bias.grad, "score_mod": self.score_mod != "off",
              "lse_grad": self.lse_grad != "off", "max_logit": self.max_logit, "kv_shared": self.kv_shared,
              **{name: getattr(self, name) is not None for name in GROUPS}}
        return tuple(f for f in FEATURES if on[f])

    @property
    def kind(self) -> str:
        return "varlen" if self.varlen is not None else "paged" if self.paged is not None else "dense"

    @property
    def sequences(self) -> tuple:
        """(seqlen_q, seqlen_k) of each sequence: a dense batch's are all the same."""
        if self.varlen is not None:
            return self.varlen.seqlens
        if self.paged is not None:
            return tuple((self.seqlen_q, n) for n in self.paged.cache_seqlens)
        return ((self.seqlen_q, self.seqlen_k),) * self.batch

    def sequence(self, i: int) -> "Case":
        """Sequence i as a dense case of batch 1 (its masks, empty rows and visible keys)."""
        sq, sk = self.sequences[i]
        return dataclasses.replace(self, batch=1, seqlen_q=max(1, sq), seqlen_k=sk, varlen=None, paged=None)

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
        if self.paged is None:
            return 0
        own = [-(-n // self.paged.page_size) for n in self.paged.cache_seqlens]
        return sum(own) - sum(self.shared_pages(b) for b in range(len(own)))

    def shared_pages(self, b: int) -> int:
        """Under pages="shared", sequence b > 0 reads its first this many pages from sequence 0's (the
        full pages both have)."""
        if self.paged is None or self.paged.pages != "shared" or b == 0:
            return 0
        lengths = self.paged.cache_seqlens
        return min(lengths[0], lengths[b]) // self.paged.page_size

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

    @classmethod
    def of(cls, *shape, **fields) -> "Case":
        """A case from its flat fields, the keys of its JSON (`Case.of(1, 4, 9, 2, 1, 64, cache_seqlens=(9,),
        page_size=4)`): each group where one of its fields is given a value other than its off value, None
        where none is. The leading fields may be given by position, as to Case."""
        for name, group in GROUPS.items():
            given = {key: fields.pop(key) for key in group.FLAT if key in fields}
            if given:
                fields[name] = grouped(group, given)
        return cls(*shape, **fields)

    @classmethod
    def flat_names(cls) -> tuple:
        """The flat fields of a case, in the order of its JSON: each group's in its place."""
        return tuple(n for f in dataclasses.fields(cls) for n in (GROUPS[f.name].FLAT if f.name in GROUPS else
                                                                   (f.name,)))

    def flat(self) -> dict:
        """Every flat field and its value (a group's off values where it is None), in flat_names order."""
        d = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            d.update(flattened(GROUPS[f.name], value) if f.name in GROUPS else {f.name: value})
        return d

    def replace(self, **changes) -> "Case":
        """This case with some flat fields changed (dataclasses.replace over the flat fields): a group is
        made, changed or dropped as Case.of makes it."""
        return type(self).of(**{**self.flat(), **changes})

    def to_dict(self) -> dict:
        d = self.flat()
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
        names = set(cls.flat_names())
        unknown = sorted(set(data) - names)
        if unknown:
            raise UsageError("case", unknown, f"unknown field(s); a Case has {', '.join(sorted(names))}")
        required = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
        missing = sorted(required - set(data))
        if missing:
            raise UsageError("case", missing, "missing required field(s)")
        if isinstance(data.get("before"), (list, tuple)):
            data = {**data, "before": tuple(cls.from_dict(c) for c in data["before"])}
        return cls.of(**data)

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
        if self.varlen is not None:
            v = self.varlen
            flags.append("varlen " + ",".join(f"{a}/{b}" for a, b in v.seqlens) + (f" tail={v.tail}" if v.tail else ""))
        if self.paged is not None:
            p = self.paged
            flags.append(f"paged cache={','.join(map(str, p.cache_seqlens))} page={p.page_size} pages={p.pages}"
                         + (f" pool={p.pool}" if p.pool else ""))
        if self.splits > 1:
            flags.append(f"splits={self.splits}" if self.shards == "off" else f"{self.shards} shards={self.splits}")
        flags += self._mask_flags()
        if self.fp8 is not None:
            flags.append(f"fp8 {self.fp8.format} descale per {self.fp8.granularity}")
        if self.lse_grad != "off":
            flags.append("loss on lse" + (" alone" if self.lse_grad == "alone" else " and out"))
        if self.max_logit:
            flags.append("max_logit")
        if self.sparse is not None:
            flags.append(f"sparse={self.sparse.indices} topk={self.sparse.topk}")
        if self.kv_shared:
            flags.append("v=k[..., :dv] (kv_shared)")
        calls = f"after {len(self.before)} call{'s' if len(self.before) > 1 else ''}: " if self.before else ""
        return (f"{calls}b{self.batch} sq{self.seqlen_q} sk{self.seqlen_k} h{self.nheads}{gqa} d{self.head_dim} "
                + " ".join(flags))


    def mask_kinds(self) -> tuple:
        """What the case masks and adds by, in words ("padding mask", "min bias", "relative score_mod"): a
        run counts its cases by them."""
        flat = self.flat()
        return tuple(f"{flat[word]} {word}" for word in ("mask", "bias", "score_mod") if flat[word] != "off")

    def _mask_flags(self) -> list:
        """"padding mask [1 1, 2 0] keys" and the like: a minimal failure reads as its pattern."""
        flags = []
        m, b = self.mask, self.bias
        if m is not None:
            words = [f"{m.pattern} mask"]
            if m.lengths is not None:
                words.append(",".join("/".join(map(str, p)) for p in m.lengths))
            if m.pattern == "block":
                words.append(f"block={m.block}")
            if m.pattern in ("block", "random"):
                words.append(f"masked={m.rate}%")
            words.append(f"shape={m.shape}" + (" nan-keys" if m.nan else ""))
            flags.append(" ".join(words))
        if b is not None:
            flags.append(f"bias={b.values} shape={b.shape}" + (" fp32" if b.dtype == "fp32" else "")
                         + (" grad" if b.grad else ""))
        if self.score_mod != "off":
            flags.append(f"score_mod={self.score_mod}")
        return flags
