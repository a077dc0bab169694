"""The verdict on a subject's tensors: the tolerance policy (docs/design.md), one place.

For each tensor T: fail if T has NaN/Inf where the FP64 reference is finite; fail if a row that sees no
key is not (out 0, lse -inf); fail if

    max_e (|T_e - ref_e| - u_T |ref_e|) > factor_T * B + max(tight_T, atol_T * (1 - B / (KNEE * F))) * F
                                         + 2^-120 + E_T

where u_T |ref_e| is the rounding of element e's exact value into T's own dtype (u_T its unit roundoff: fp32
for lse and dsinks), which no kernel can avoid and which the floor below does not pay for where the terms'
roundings and the result's add up (an FA2-style fp16 dv, P rounded to fp16 before P^T dO, then the sum
rounded: 1 ulp at 3.4, 0.00195 against a floor of 0.00167, for b1 sq1 sk128 h4/2 d132 fp16 peaked spread
scale=2 seed 1089); B = max|baseline_T - ref| is the error of the naive same-dtype attention, F = u(dtype) *
scale_T the floor unit (dtypes.FLOOR_UNIT: the unit roundoff 2^-8 for bf16, 2^-11 for fp16, and 64 roundings
2^-18 for fp32), scale_T the magnitude of the terms summed into T (scales.ScaleAccumulator). Beside
factor_T * B, the floor does not vanish when the reference is exactly zero (dk with seqlen_k == 1) or when
the baseline happens to be exact:
- atol_T * F, one rounding of each term in the case's dtype, where the baseline is exact; it shrinks to
  tight_T * F as B grows to KNEE * F: a baseline that rounded that much measures what rounding costs, and
  the full floor on top of it would let a kernel with several times its error pass wherever F is as large
  as the errors themselves (the CPU sizes). KNEE and tight are calibrated on correct kernels
  (docs/measurements.md, "Tolerance floor");
- 2^-120 (FLUSHED): GPU fp32 arithmetic flushes subnormal results (below 2^-126) to zero (Triton's exp2
  and products do), where the FP64 reference and the baseline keep them. A tensor whose terms all lie
  down there (a sink that takes all the weight leaves p ~ 1e-40 for every key) comes back as zeros and
  products of them: errors of a few 2^-126 that no 16-bit result can show. 2^-120 is 64 flushed values.
- E_T: what the flash algorithm's own roundings cost, which the naive baseline never makes
  (flash_bound.py): the weights the forward and the backward form from fp32 logits and an fp32 lse, the
  backward's S recomputed in another order, softcap's derivative as 1 - tanh^2, dS rounded to the input dtype
  below its smallest normal. Computed element by element beside the FP64 reference.
When the rounding of the logits passes 1 (2 u S > 1, with S the logit bound and u their sum's unit, fp32's
or an FP8 tensor core's 2^-13: every element 133120 gives logits near 1e9, one fp32 ulp of which is 64; FP8
logits near 6000), the attention weights are not determined by the kernel's logits at all: a conforming
kernel may legitimately give all the weight to one key among equals. The case is then ill-conditioned: the
tolerance is waived for out and the gradients (counted and reported as waived), while NaN/Inf, the
rows-that-see-no-key rule and lse are still checked, judging.py holds out to its values' hull, and the
gradient check judges the gradients against the subject's own forward (run/evaluate.py).

The baseline and flash terms of out are capped together at OUT_CAP * max|ref_out|: a naive attention that
rounds large logits to the dtype is as wrong as zeros, and so is a flash kernel whose weights its logits'
rounding leaves undetermined (FP8 logits near 6000); an allowance of that size would let zeros pass.

Two exceptions to the Inf rule. An Inf in dq or dk passes in an ill-conditioned case: the weights there are
any a conforming kernel's fp32 logits give, and dq, dk scale with q and k (a sink above a key by less than one
fp32 ulp of logits near 1e10 ties with it in fp32: weight 1/2 where the FP64 weight is 0, and dq = dS K
reaches 1.7e8 with fp16 inputs of 32768, past fp16's range). And an Inf in out or a gradient passes where a
value within the allowed error of that element's reference lies past the dtype's range (|ref_e| + allowed
reaches the largest finite value and half its ulp, with the Inf's sign): Inf is then what rounding an
allowed result to the dtype gives (an fp16 dq of 65000 computed in fp32 as 65530 is Inf in fp16; the fp16 dk
of a key seen by every row, whose terms cancel to exactly 0, is rounding noise of size u32 * scale_T: at
bf16-scale logits, 1e19 against fp16's 65504).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from faverify.cases.vocabulary import ROW_LOGITS, TENSORS
from faverify.dtypes import FLOOR_UNIT, TORCH, UNIT_ROUNDOFF
from faverify.errors import UsageError
from faverify.judge.metrics import ErrorStats, TensorMetrics

# flash-attention's own suite allows 2x the baseline error for out and 3x for the gradients.
DEFAULT_FACTOR = {"out": 2.0, "lse": 2.0, "dq": 3.0, "dk": 3.0, "dv": 3.0, "dsinks": 3.0, "dbias": 3.0,
                  "max_logit": 2.0}
DEFAULT_ATOL = {"out": 1.0, "lse": 1.0, "dq": 1.0, "dk": 1.0, "dv": 1.0, "dsinks": 1.0, "dbias": 1.0,
                "max_logit": 1.0}
# The floor left beside an informative baseline, in the same unit u(dtype) * scale_T: calibrated
# (docs/measurements.md, "Tolerance floor") as the largest floor any correct subject needed there, with margin.
DEFAULT_TIGHT = {"out": 0.25, "lse": 0.25, "dq": 0.25, "dk": 0.25, "dv": 0.25, "dsinks": 0.25, "dbias": 0.25,
                 "max_logit": 0.25}
KNEE = 0.25  # a baseline error of KNEE * F or more is informative: the floor beside it is the tight one
FLUSHED = 2.0 ** -120  # what flushing fp32 subnormals to zero may cost (the docstring's last floor term)
# out's baseline term is at most this share of max|ref|: where the naive attention rounds logits of 1e3 to
# bf16 its error reaches out's own size (0.6-1.0 x max|ref| in the "large" regime), and twice that allowed
# zeros and the mean of V; a kernel that keeps its logits in fp32 errs by 0.4% of max|ref| there (sdpa-math).
# Never below the dtype's smallest subnormal: an out of 7e-15 (a sink that takes all the weight) is 0 in fp16,
# an error of all of it that no kernel avoids
OUT_CAP = 0.5


@dataclass(frozen=True)
class Tolerance:
    factor: dict = field(default_factory=lambda: dict(DEFAULT_FACTOR))
    atol: dict = field(default_factory=lambda: dict(DEFAULT_ATOL))
    tight: dict = field(default_factory=lambda: dict(DEFAULT_TIGHT))

    @staticmethod
    def ill_conditioned(logit: float, unit: float = UNIT_ROUNDOFF["fp32"]) -> bool:
        """Whether the logits' rounding (unit: of their sum, fp32's or an FP8 tensor core's) passes 1."""
        return 2 * unit * logit > 1.0

    def allowed(self, tensor: str, dtype: str, baseline_err: float, scale: float, flash: float = 0.0) -> float:
        return sum(self.terms(tensor, dtype, baseline_err, scale, flash))

    def terms(self, tensor: str, dtype: str, baseline_err: float, scale: float, flash: float = 0.0) -> tuple:
        """(from the baseline, the floor): the two parts of the allowed error. The full floor atol * F stands
        where the baseline is exact; it shrinks linearly to the tight floor as the baseline's own error grows
        to KNEE * F: from there the baseline has rounded as a kernel does, and a kernel several times its
        error fails even where F is as large as the errors themselves (a running statistic kept in 16 bits).
        flash: E_T, the flash algorithm's own roundings (flash_bound.py), part of the floor."""
        base = baseline_err if math.isfinite(baseline_err) else 0.0
        unit = FLOOR_UNIT[dtype] * scale
        knee = KNEE * unit  # 0 where scale is a subnormal double: then no baseline is informative
        informative = min(1.0, base / knee) if knee > 0 else 1.0
        coef = max(self.tight[tensor], self.atol[tensor] * (1.0 - informative))
        return self.factor[tensor] * base, coef * unit + FLUSHED + flash

    def describe(self) -> str:
        return (f"max(|T-ref| - u_T*|ref|) <= factor*B + max(tight, atol*(1 - B/({KNEE:g}*F)))*F "
                "+ 2^-120 + E_T, E_T the flash algorithm's own roundings (fp32 logits and lse, S recomputed, "
                "1 - tanh^2, dS rounded), u_T the unit roundoff of T's dtype, B = max|baseline-ref|, "
                "F = u(dtype)*scale_T, u = 2^-8 bf16, 2^-11 fp16, 2^-18 fp32; "
                + ", ".join(f"{t}: factor {self.factor[t]:g}, atol {self.atol[t]:g}, tight {self.tight[t]:g}"
                            for t in TENSORS))

    def to_dict(self) -> dict:
        return {"factor": dict(self.factor), "atol": dict(self.atol), "tight": dict(self.tight),
                "rule": self.describe()}

    @classmethod
    def from_dict(cls, data: dict) -> "Tolerance":
        return cls(factor=dict(data["factor"]), atol=dict(data["atol"]), tight=dict(data.get("tight", DEFAULT_TIGHT)))


def parse_overrides(text: str | None, defaults: dict, argument: str) -> dict:
    """'out=2,dq=4' or a single number for every tensor."""
    values = dict(defaults)
    if not text:
        return values
    for part in text.split(","):
        name, sep, number = part.partition("=")
        if not sep:
            name, number = "*", name
        name = name.strip()
        try:
            x = float(number)
        except ValueError:
            raise UsageError(argument, part, "each entry must be TENSOR=NUMBER or NUMBER") from None
        if not math.isfinite(x) or x < 0:
            raise UsageError(argument, part, "must be a finite number >= 0")
        if name == "*":
            values = {t: x for t in values}
        elif name in values:
            values[name] = x
        else:
            raise UsageError(argument, name, f"tensor must be one of {', '.join(TENSORS)}")
    return values


def parse_tolerance(factor: str | None, atol: str | None, tight: str | None = None) -> Tolerance:
    """The tolerance of --factor, --atol and --tight (each parse_overrides' text, None for the defaults)."""
    return Tolerance(factor=parse_overrides(factor, DEFAULT_FACTOR, "--factor"),
                     atol=parse_overrides(atol, DEFAULT_ATOL, "--atol"),
                     tight=parse_overrides(tight, DEFAULT_TIGHT, "--tight"))


def judge_tensor(stats: ErrorStats, dtype: str, tolerance: Tolerance) -> TensorMetrics:
    """The verdict on one tensor: its statistics, the error allowed, and why it fails (if it does)."""
    name, s, scale, logit = stats.tensor, stats.values, stats.scale, stats.logit
    # lse is float32, but its floor follows the inputs' dtype, as its baseline does
    base = s["baseline_max_abs"]
    waived = name not in ROW_LOGITS and tolerance.ill_conditioned(logit, stats.logit_unit)
    from_baseline, floor = tolerance.terms(name, dtype, base, scale)
    flash = stats.flash
    if name == "out":  # a yardstick as wrong as zeros allows nothing: OUT_CAP
        smallest = torch.finfo(TORCH[dtype]).smallest_normal * torch.finfo(TORCH[dtype]).eps
        from_baseline, flash = min(from_baseline + flash, max(OUT_CAP * s["ref_max"], smallest)), 0.0
    floor += flash
    allowed = from_baseline + floor
    reasons = []
    if s["nan"]:
        reasons.append(f"{int(s['nan'])} NaN where the reference is finite")
    # dq and dk scale with the logits' inputs: where the weights are undetermined (waived), a conforming
    # kernel's weights give gradients past the dtype's range, and Inf is such a result rounded
    unbounded = waived and name in ("dq", "dk")
    # an Inf is a value within the allowance rounded to the dtype where the allowance reaches past its range
    # (inf_gap: absent from statistics written before it was kept, where the largest finite value stands in)
    reachable = name not in ROW_LOGITS and s.get("inf_gap", torch.finfo(TORCH[dtype]).max) <= allowed
    if s["inf"] and not reachable and not unbounded:
        reasons.append(f"{int(s['inf'])} Inf where the reference is finite")
    if s["masked_bad"]:
        want = "-inf" if name in ROW_LOGITS else "0"
        reasons.append(f"{int(s['masked_bad'])} entries of rows that see no key are not {want}")
    # beyond_rounding: absent from statistics written before it was kept, where max_abs stands in
    if s.get("beyond_rounding", s["max_abs"]) > allowed and not waived:
        reasons.append(f"max error {s['max_abs']:.3g} > allowed {allowed:.3g}")
    # against the baseline's error, or one rounding of the tensor's terms where the baseline is more exact
    # than that (an exact baseline would make any error "infinitely" worse)
    unit = UNIT_ROUNDOFF[dtype] * scale
    denominator = max(base, unit)
    ratio = s["max_abs"] / denominator if denominator > 0 else (0.0 if s["max_abs"] == 0 else math.inf)
    return TensorMetrics(
        tensor=name, max_abs=s["max_abs"], mean_abs=s["mean_abs"], rmse=s["rmse"],
        # relative to the larger of max|ref| and the terms' magnitude: a reference ~0 (dk at seqlen_k 1)
        # would make any rounding error relatively huge
        max_rel=s["max_abs"] / max(s["ref_max"], scale) if max(s["ref_max"], scale) > 0
        else (0.0 if s["max_abs"] == 0 else math.inf),
        ref_max=s["ref_max"],
        max_ulp=s["max_ulp"], nan=int(s["nan"]), inf=int(s["inf"]), masked_bad=int(s["masked_bad"]),
        baseline_max_abs=base, ratio=ratio, scale=scale, allowed=allowed, floor=floor, waived=waived,
        worst_index=stats.worst_index, passed=not reasons, reason="; ".join(reasons),
    )


def judge_all(stats: dict, dtype: str, tolerance: Tolerance) -> dict:
    """judge_tensor() for every tensor of error_stats' result, by name."""
    return {name: judge_tensor(s, dtype, tolerance) for name, s in stats.items()}


def kind(m: TensorMetrics) -> str:
    """The failure class of a failing tensor, the second half of its signature ("dq:nan")."""
    if m.nan:
        return "nan"
    if m.inf:
        return "inf"
    if m.masked_bad:
        return "masked-rows"
    return "tolerance"
