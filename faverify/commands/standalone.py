"""`faverify repro --standalone FILE.py`: one case as a script a library's maintainer runs with torch and the
library alone, without faverify.

The script loads the case's inputs from FILE.pt beside it (q, k, v and dO as the failing call got them:
torch.save keeps their strides, offsets and zero strides), calls the subject the way its users do, computes
the FP64 reference in a few plain lines, and compares each tensor faverify judged with the error faverify
allowed on this case (the same rule: max(|T - ref| - u_T |ref|) <= allowed). It prints the largest error,
expected and observed where it sits, what of it is past the tensor's own rounding against what is allowed,
a version block, and exits 1 while the defect is there, 0 once fixed.
"""
from __future__ import annotations

import datetime
import io
from pathlib import Path

import torch

from faverify import __version__
from faverify.cases.case import Case
from faverify.cases.conventions import DEFAULT as DEFAULT_CONVENTIONS
from faverify.cases.inputs import make_inputs
from faverify.dtypes import UNIT_ROUNDOFF
from faverify.errors import UsageError
from faverify.files import replace_whole
from faverify.reports.case_result import CaseResult
from faverify.subjects.base import Subject

# the tensors the script's reference computes: the output, its log-sum-exp and the three gradients
JUDGED = ("out", "lse", "dq", "dk", "dv")


def refusal(subject: Subject, case: Case) -> str | None:
    """Why this subject's case cannot be written as a standalone script, or None."""
    if not subject.standalone:
        return f"{subject.name} has no standalone call (module:function subjects and the sdpa backends have one)"
    extra = [f for f in case.features() if f != "head_dim_v"]
    if case.before:
        return "takes a case of one call; this one has earlier calls"
    if case.kind != "dense" or extra:
        return ("takes a dense case without variant features, masks or biases; this one has "
                + (", ".join(extra) or case.kind))
    return None


def write(path: Path, subject: Subject, case: Case, result: CaseResult, device: torch.device) -> Path:
    """The script at `path` and its inputs beside it (path with suffix .pt): the inputs' file."""
    why = refusal(subject, case)
    if why:
        raise UsageError("--standalone", str(path), why)
    x = make_inputs(case, device, requires_grad=False)
    inputs = inputs_of(path)
    saved = io.BytesIO()
    torch.save({"q": x.q.cpu(), "k": x.k.cpu(), "v": x.v.cpu(), "dout": x.dout.cpu()}, saved)
    # each written whole through a new file, never through a link planted at its name
    replace_whole(inputs, saved.getvalue())
    replace_whole(path, script(subject, case, result, device, inputs.name))
    return inputs


def inputs_of(path: Path) -> Path:
    """The inputs' file of the script at `path`: beside it, with the suffix .pt."""
    return Path(path).with_suffix(".pt")


def script(subject: Subject, case: Case, result: CaseResult, device: torch.device, inputs: str) -> str:
    judged = {t: m for t, m in result.metrics.items() if t in JUDGED}
    if subject.caps.conventions != DEFAULT_CONVENTIONS:  # its lse in its own units: not compared
        judged.pop("lse", None)
    allowed = {t: m.allowed for t, m in judged.items()}
    unit = {t: UNIT_ROUNDOFF["fp32" if t == "lse" else case.dtype] for t in judged}
    header = (f'"""{subject.name} on {case.short()}\n\nWritten by faverify {__version__} on '
              f'{datetime.date.today()}; runs with torch and the subject alone. Exit 1 while the defect is there, '
              f'0 once fixed.\nThe case: {case.to_json()}\n"""')
    settings = (f"INPUTS = Path(__file__).with_name({inputs!r})  # q, k, v, dO as the call got them, strides too\n"
                f"DEVICE = {device.type!r}\n"
                f"CAUSAL = {case.causal!r}  # bottom-right: row i sees keys j <= i + sk - sq\n"
                f"SCALE = {case.softmax_scale!r}  # None: the subject's default, head_dim ** -0.5\n"
                f"ALLOWED = {allowed!r}  # faverify's tolerance for this case, per tensor\n"
                f"UNIT = {unit!r}  # each tensor's unit roundoff: its own rounding is not counted\n")
    return "\n".join([header, "import sys", "from pathlib import Path", "", "import torch", "", subject.standalone,
                      "", settings, _BODY])


_BODY = '''
def reference(q, k, v, causal, scale):
    """FP64 attention over [b, s, h, d]: k and v shared by groups of query heads, bottom-right causal;
    a row that sees no key gives out 0 and lse -inf."""
    q, k, v = (t.double().transpose(1, 2) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if causal:
        sq, sk = s.shape[-2:]
        rows, cols = torch.arange(sq, device=s.device)[:, None], torch.arange(sk, device=s.device)[None, :]
        s = s.masked_fill(cols > rows + sk - sq, float("-inf"))
    top = s.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    p = torch.exp(s - top)
    total = p.sum(dim=-1, keepdim=True)
    out = torch.where(total > 0, (p / total.clamp_min(1e-300)) @ v, torch.zeros_like(v[..., :1, :]))
    lse = (top + torch.log(total)).squeeze(-1)
    return out.transpose(1, 2), lse


def gradients(fn, q, k, v, dout):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    out = out[0] if isinstance(out, (tuple, list)) else out
    if not out.requires_grad:
        return None
    return dict(zip(("dq", "dk", "dv"), torch.autograd.grad(out, leaves, dout.to(out.dtype), allow_unused=True)))


def versions():
    lines = [f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}"]
    if DEVICE == "cuda":
        major, minor = torch.cuda.get_device_capability()
        lines.append(f"GPU {torch.cuda.get_device_name()} (sm {major}.{minor})")
    from importlib import metadata
    for name in ("flash-attn-4", "flash-attn", "flashinfer-python", "triton"):  # the wheels, not the modules
        try:
            lines.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    return lines


def main():
    x = torch.load(INPUTS, map_location=DEVICE)
    q, k, v, dout = x["q"], x["k"], x["v"], x["dout"]
    got = call(q, k, v, CAUSAL, SCALE)
    out, lse = (got[0], got[1]) if isinstance(got, (tuple, list)) else (got, None)
    with torch.no_grad():
        want_out, want_lse = reference(q, k, v, CAUSAL, SCALE)
    pairs = {"out": (out, want_out), "lse": (lse, want_lse)}
    if {"dq", "dk", "dv"} & set(ALLOWED):
        mine = gradients(lambda *t: call(*t, CAUSAL, SCALE), q, k, v, dout)
        ref = gradients(lambda *t: reference(*t, CAUSAL, SCALE)[0], q.double(), k.double(), v.double(), dout)
        for name in ("dq", "dk", "dv"):
            pairs[name] = (None if mine is None else mine[name], ref[name])
    failed = False
    for name, allowed in ALLOWED.items():
        t, ref = pairs[name]
        if t is None:
            print(f"{name}: not returned")
            failed = True
            continue
        t, ref = t.detach().double(), ref.detach().double()
        error = (t - ref).abs().nan_to_num(float("inf"))  # NaN: as bad as it gets
        error = torch.where(t == ref, torch.zeros_like(error), error)  # equal infinities too
        excess = (error - UNIT[name] * ref.abs()).nan_to_num(float("inf"))  # its own rounding is not counted
        where = tuple(int(i) for i in torch.unravel_index(error.argmax(), error.shape))
        judged = max(0.0, float(excess.max()))
        bad = judged > allowed
        failed |= bad
        print(f"{name}: {'FAIL' if bad else 'pass'}, max error {float(error.max()):.3g} at {list(where)}: "
              f"expected {float(ref[where]):.6g}, observed {float(t[where]):.6g}; beyond the tensor's own "
              f"rounding {judged:.3g}, allowed {allowed:.3g}")
    print("\\n".join(versions()))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
'''
