"""Error statistics of a subject's tensors against the FP64 reference and the naive baseline (the
verdict on them is verdict.py's).

All statistics of a case are computed on the device and moved to the host in one transfer: the fuzz
loop runs thousands of cases and each host sync costs as much as a small kernel.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from faverify.cases.vocabulary import ROW_LOGITS

_STATS = ("max_abs", "mean_abs", "rmse", "ref_max", "max_ulp", "nan", "inf", "masked_bad",
          "baseline_max_abs", "worst", "beyond_rounding", "inf_gap")


@dataclass
class TensorMetrics:
    tensor: str
    max_abs: float
    mean_abs: float
    rmse: float
    max_rel: float  # max_abs / max(max|ref|, scale)
    ref_max: float  # max|ref|: what the absolute errors compare with (an lse of logits near 1e9 is near 1e9)
    max_ulp: float  # the error in ulps of the tensor's dtype at max(|ref|, scale) (see _max_ulp)
    nan: int  # NaN where the reference is finite
    inf: int
    masked_bad: int  # entries of rows that see no key that are not (out 0, lse -inf, dq 0)
    baseline_max_abs: float
    ratio: float  # max_abs / max(baseline_max_abs, one rounding of scale): verdict.judge_tensor
    scale: float
    allowed: float
    floor: float  # the part of allowed that is not factor * baseline_max_abs (verdict.Tolerance.terms)
    waived: bool  # ill-conditioned case: the tolerance was not applied (verdict.Tolerance.ill_conditioned)
    worst_index: list  # index of the largest error, in the tensor's own shape
    passed: bool
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TensorMetrics":
        # a version-1 run file does not split the allowed error; before version 3 max|ref| was not kept
        return cls(**{"floor": math.nan, "ref_max": math.nan, **d})


@dataclass(frozen=True)
class ErrorStats:
    """One tensor's raw statistics (the keys of _STATS), with what the tolerance needs besides: the
    magnitude of its terms (scale_T), the largest logit bound S, where its largest error sits, and what the
    flash algorithm's own roundings may cost it (E_T, flash_bound.FlashBound)."""
    tensor: str
    values: dict
    scale: float
    logit: float
    worst_index: list
    flash: float = 0.0
    logit_unit: float = 2.0**-24  # the unit of the logits' sum (flash_bound.Dot): fp32's, or an FP8 core's


def error_stats(got: dict, ref: dict, base: dict, scales: dict, *, tensors: tuple[str, ...],
                masked_rows: int = 0, empty_rows: tuple | None = None, sinks: bool = False,
                empty_lse: float = -math.inf, empty_mask: torch.Tensor | None = None) -> dict:
    """ErrorStats for each named tensor the subject produced. empty_rows: (start, stop) of the query rows
    that see no key (Case.empty_rows), or masked_rows: the first that many (bottom-right alignment), or
    empty_mask: a bool [B, h, S] of them (a ragged case's, whose sequences differ). Their out and dq must
    be 0 and their lse `empty_lse`. With sinks such a row's lse is the sink's logit, judged by the
    tolerance like any other."""
    rows_empty = empty_mask if empty_mask is not None else empty_rows if empty_rows is not None else (0, masked_rows)
    rows, names = [], []
    for name in tensors:
        if got.get(name) is None:
            continue
        rows.append(_raw_stats(name, got[name], ref[name], base[name],
                               (0, 0) if sinks and name == "lse" else rows_empty, empty_lse, scales[name]))
        names.append(name)
    if not rows:
        return {}
    scale_values = torch.stack([scales[n].to(torch.float64) for n in names])
    logit = scales["logit"].to(torch.float64).expand(len(names))
    zero = torch.zeros((), dtype=torch.float64, device=scale_values.device)
    flash = torch.stack([scales.get(f"{n}_flash", zero).to(torch.float64) for n in names])
    unit = scales.get("logit_unit", zero + 2.0**-24).to(torch.float64).expand(len(names))
    host = torch.cat([torch.stack(rows).to(torch.float64), scale_values[:, None], logit[:, None], flash[:, None],
                      unit[:, None]], dim=1).tolist()
    result = {}
    for name, values in zip(names, host):
        s = dict(zip(_STATS, values[:-4]))
        scale, max_logit, flash, logit_unit = values[-4:]
        result[name] = ErrorStats(name, s, scale, max_logit, _unravel(int(s["worst"]), tuple(got[name].shape)),
                                  flash, logit_unit)
    return result


def _raw_stats(name, got, ref, base, empty, empty_lse, scale):
    """Statistics of one tensor as a single device vector: a few ops per tensor, since a fuzz case on a
    GPU is bound by kernel launches, not arithmetic. got and base enter the FP64 arithmetic as they are
    (a difference with the FP64 reference is computed in FP64, exactly as after a cast, without one)."""
    got = got.detach()
    diff = (got - ref).abs()  # NaN where got is NaN; NaN or Inf where got is Inf
    gap = None
    if name in ROW_LOGITS:  # the tensors whose reference has non-finite entries (-inf rows)
        fin = torch.isfinite(ref)
        diff = torch.where(fin, diff, 0.0)
        gbad = fin & ~torch.isfinite(got)
        nan = (gbad & torch.isnan(got)).sum(dtype=torch.float64)
        inf = (gbad & torch.isinf(got)).sum(dtype=torch.float64)
        n = fin.sum().clamp(min=1)
        ref_abs = torch.where(fin, ref.abs(), 0.0)
        base_diff = torch.where(fin, (base - ref).abs(), 0.0)
    else:  # a non-finite entry of got is NaN or Inf where the reference is finite
        # but where the exact value lies past the dtype's largest finite one, rounding it to the dtype gives
        # Inf (or that largest value, saturated): there both sides are compared saturated to the range
        top = torch.finfo(got.dtype).max

        def saturated(t):  # in the reference's FP64: a baseline of another dtype may not hold top
            return t.to(ref.dtype).clamp(-top, top)
        past = ref.abs() > top
        ref_top = saturated(ref)
        diff = torch.where(past, (saturated(got) - ref_top).abs(), diff)
        nan = torch.isnan(got).sum(dtype=torch.float64)
        infs = torch.isinf(got) & ~past
        inf = infs.sum(dtype=torch.float64)
        # the allowance an Inf needs to be a value within it rounded to the dtype: from the reference to the
        # first value that rounds to an Inf of its sign (the largest finite value and half its ulp)
        overflow = top + torch.finfo(got.dtype).eps * 2.0 ** math.floor(math.log2(top)) / 2
        gap = torch.where(infs, overflow - torch.sign(got.to(ref.dtype)) * ref, -math.inf).amax() if infs.numel() \
            else ref.new_zeros(())
        n = max(1, ref.numel())  # a Python number: no copy to the device
        ref_abs = ref.abs()
        base_diff = torch.where(past, (saturated(base) - ref_top).abs(), (base - ref).abs())
    err = diff.nan_to_num(nan=0.0, posinf=0.0)  # 0 wherever got is not finite
    ranking = diff.nan_to_num(nan=math.inf)  # a non-finite output is the worst element there is
    if err.numel() == 0:
        return torch.zeros(len(_STATS), dtype=torch.float64, device=ref.device)
    return torch.stack([
        err.amax(),
        err.sum() / n,
        (err.square().sum() / n).sqrt(),
        ref_abs.amax(),
        _max_ulp(got.dtype, err, ref_abs, scale),
        nan,
        inf,
        _masked_bad(name, got, empty, empty_lse),
        base_diff.amax(),  # NaN when the baseline itself is NaN where the reference is finite
        ranking.reshape(-1).argmax().to(torch.float64),
        # the error beyond each element's own rounding into the tensor's dtype (verdict.py says why)
        (err - ref_abs * 2.0 ** -(_SIGNIFICAND_BITS[got.dtype] + 1)).amax().clamp(min=0.0),
        gap if gap is not None else ref.new_full((), math.inf),
    ])


_EMPTY_ROWS_CHECKED = ("out", "lse", "dq", "max_logit")  # the tensors with a value given where a row sees no key


def _masked_bad(name, g, empty, empty_lse):
    """Rows that see no key: out and dq must be 0, lse -inf (or the declared value; docs/design.md). The
    rows come from the case, on the host: no device sync."""
    if name == "max_logit":  # whatever lse's convention, a row that sees no key has no largest logit
        empty_lse = -math.inf
        if g.dim() == 1:  # one per head: no rows of its own
            return torch.zeros((), dtype=torch.float64, device=g.device)
    if name not in _EMPTY_ROWS_CHECKED:
        return torch.zeros((), dtype=torch.float64, device=g.device)
    if isinstance(empty, torch.Tensor):
        if name in ROW_LOGITS:
            return ((g != empty_lse) & empty).sum().to(torch.float64)
        return ((g != 0) & empty.transpose(1, 2).unsqueeze(-1)).sum().to(torch.float64)
    if empty[1] <= empty[0]:
        return torch.zeros((), dtype=torch.float64, device=g.device)
    rows = slice(*empty)
    if name in ROW_LOGITS:  # [b, h, sq]
        return (g[:, :, rows] != empty_lse).sum().to(torch.float64)
    return (g[:, rows] != 0).sum().to(torch.float64)  # [b, sq, h, d]


_SIGNIFICAND_BITS = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23, torch.float64: 52}


def _max_ulp(dtype, err, ref_abs, scale):
    """The largest error in ulps of the tensor's dtype, each entry's ulp taken at the larger of its
    reference value and the tensor's typical magnitude (scale_T): near zero the representable values
    crowd together, and a distance in representable values there (a harmless 1e-16 counting 1e9 of them)
    says nothing about the error. err is 0 wherever the output is not finite (and where lse's reference is
    not), and every ulp is a positive finite number, so those entries count 0 ulps."""
    if err.numel() == 0:
        return err.new_zeros(())
    magnitude = torch.maximum(ref_abs, scale.to(torch.float64)).clamp(min=torch.finfo(dtype).tiny)
    # the ulp is 2^(exponent - significand bits): the float64 with magnitude's exponent field less the
    # significand bits and a zero fraction (magnitude is normal and at least the dtype's tiny, so the
    # difference stays a normal exponent)
    exponent = magnitude.view(torch.int64) >> 52  # sign 0, so the biased exponent alone
    ulp = ((exponent - _SIGNIFICAND_BITS[dtype]) << 52).view(torch.float64)
    return (err / ulp).amax()


def _unravel(flat: int, shape: tuple) -> list:
    index = []
    for dim in reversed(shape):
        index.append(flat % dim if dim else 0)
        flat //= dim if dim else 1
    return index[::-1]
