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

DTYPES = ("bf16", "fp16", "fp32")
REGIMES = ("normal", "large", "bf16-scale", "outliers", "constant", "peaked", "tiny")
LAYOUTS = ("contiguous", "transposed", "strided", "packed")
INITS = ("-inf", "-1e30")
MAX_HEAD_DIM = 256
MAX_SEED = 2**63


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

    def __post_init__(self) -> None:
        for name in ("batch", "nheads", "nheads_k", "head_dim"):
            _require_int(name, getattr(self, name), minimum=1)
        for name in ("seqlen_q", "seqlen_k"):
            _require_int(name, getattr(self, name), minimum=0)
        _require_int("seed", self.seed, minimum=0)
        if self.seed >= MAX_SEED:  # torch.Generator.manual_seed takes 64 bits
            raise UsageError("seed", self.seed, f"must be < 2^63 ({MAX_SEED})")
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
            if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s <= 0:
                raise UsageError("softmax_scale", s, "must be a finite number > 0, or null for head_dim ** -0.5")

    @property
    def scale(self) -> float:
        return self.head_dim ** -0.5 if self.softmax_scale is None else float(self.softmax_scale)

    @property
    def group(self) -> int:
        return self.nheads // self.nheads_k

    def visible_keys(self, i: int) -> int:
        """How many keys query row i sees (causal is bottom-right aligned)."""
        if not self.causal:
            return self.seqlen_k
        return max(0, min(self.seqlen_k, i + self.seqlen_k - self.seqlen_q + 1))

    @property
    def masked_rows(self) -> int:
        """How many query rows see no key: always the first ones (bottom-right alignment)."""
        if self.seqlen_k == 0:
            return self.seqlen_q
        return max(0, self.seqlen_q - self.seqlen_k) if self.causal else 0

    @property
    def has_masked_rows(self) -> bool:
        return self.masked_rows > 0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

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
        return cls.from_dict(data)

    def short(self) -> str:
        """One readable line for tables and progress."""
        gqa = f"/{self.nheads_k}" if self.nheads_k != self.nheads else ""
        flags = [self.dtype, "causal" if self.causal else "full", self.regime, self.layout, f"init={self.init}"]
        if self.softmax_scale is not None:
            flags.append(f"scale={self.softmax_scale:g}")
        return (f"b{self.batch} sq{self.seqlen_q} sk{self.seqlen_k} h{self.nheads}{gqa} d{self.head_dim} "
                + " ".join(flags))


def _require_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(name, value, "must be an integer")
    if value < minimum:
        raise UsageError(name, value, f"must be >= {minimum}")
