"""`faverify doctor`: is attention numerics right on this machine, on every GPU?

One row per check and device: Pass / Fail / Warn / Skip with the reason. CPU checks always run; no GPU
is a Warn; a check that ran nothing never passes. Documented defects of torch's SDPA backends
(KNOWN_DEFECTS: garbage on rows that see no key, NaN gradients at bf16-scale values) are a Warn naming
them, so a healthy machine is not failed for a backend's behaviour on every machine; any other failure of
the same backend is still a Fail, and the fuzzer still reports them all as failures.
"""
from __future__ import annotations

import hashlib
import platform
import time
from dataclasses import asdict, dataclass

import torch

from faverify import env as environment
from faverify.cases import golden_files
from faverify.commands import golden
from faverify.errors import EnvironmentProblem
from faverify.run.evaluate import evaluate
from faverify.streams import say
from faverify.subjects import controls, resolve


@dataclass(frozen=True)
class Defect:
    """A backend's documented defect: a failing golden row that matches it is a Warn, not a Fail."""
    name: str
    source: str
    matches: object  # (golden verify row) -> bool


MASKED_ROWS = Defect("garbage on rows that see no key", "docs/torch-backends.md",
                     lambda row: row["case"].has_masked_rows)
# All-133120 bf16 inputs (the regime named after a production kernel's NaN bug): torch 2.11's flash and
# memory-efficient backwards return NaN/Inf gradients while out and lse are right. Found by `faverify fuzz`
# on the H200 (docs/torch-backends.md); it is the backend's, on every GPU, not the machine's.
BF16_SCALE_GRADIENTS = Defect("NaN/Inf gradients at bf16-scale values", "docs/torch-backends.md",
                              lambda row: row["case"].regime == "bf16-scale" and row["case"].dtype == "bf16"
                              and ("NaN" in row["reason"] or "Inf" in row["reason"])
                              and not any(t in row["reason"] for t in ("out:", "lse:")))
KNOWN_DEFECTS = {
    "sdpa-flash": (BF16_SCALE_GRADIENTS,),
    "sdpa-efficient": (MASKED_ROWS, BF16_SCALE_GRADIENTS),
    "sdpa-cudnn": (MASKED_ROWS,),
}
CUDA = ("cuda", "cuda-simt")
SDPA = ("sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn")


@dataclass
class Check:
    check: str
    device: str
    status: str  # Pass, Fail, Warn, Skip
    detail: str


def _golden_check(kernel: str, device: str, names, tolerance, isolate: bool) -> Check:
    return _judge_golden(kernel, device, golden.verify(kernel, device, tolerance=tolerance, names=names,
                                                       isolate=isolate))


def _judge_golden(kernel: str, device: str, rows: list) -> Check:
    label = f"golden: {kernel}"
    outcome = golden.summarize(rows)
    passed, bad, skipped = len(outcome["passed"]), outcome["bad"], len(outcome["skipped"])
    if not passed and not bad:
        reasons = sorted({r["reason"] for r in rows})[:2]
        return Check(label, device, "Skip", f"no golden case ran ({'; '.join(reasons)})")
    known = KNOWN_DEFECTS.get(kernel, ())
    if bad and all(r["status"] == "fail" and any(d.matches(r) for d in known) for r in bad):
        seen = [d for d in known if any(d.matches(r) for r in bad)]
        named = "; ".join(f"{d.name} ({d.source})" for d in seen)
        return Check(label, device, "Warn", f"{len(bad)} of {len(rows)} cases fail, each a known defect of {kernel}: "
                     f"{named}; {passed} pass")
    if bad:
        shown = "; ".join(f"{r['name']}: {r['reason'][:160]}" for r in bad[:3])
        return Check(label, device, "Fail", f"{len(bad)} of {len(rows)} cases fail: {shown}")
    extra = f", {skipped} not supported by the kernel" if skipped else ""
    return Check(label, device, "Pass", f"{passed} cases pass{extra}")


# Workers per golden check on each GPU: the Triton kernels compile per variant (seconds each), so their
# cases are spread over several workers; the others are launch-bound and one worker each keeps up.
GOLDEN_WORKERS = {"triton": 4}


def _gpu_golden_checks(kernels_by_device: dict, names, tolerance) -> dict:
    """Every (kernel, device) golden check at once (golden.verify_many): {(kernel, device): Check}."""
    jobs = [(k, d, GOLDEN_WORKERS.get(k, 1)) for d, kernels in kernels_by_device.items() for k in kernels]
    checks = {}

    def done(kernel, device, rows):
        checks[(kernel, device)] = check = _judge_golden(kernel, device, rows)
        _show(check)

    golden.verify_many(jobs, tolerance=tolerance, names=names, on_done=done)
    return checks


def _fingerprint(kernel: str, device: str, runs: int) -> list:
    """sha256 of a bundled kernel's out, lse and gradients on one stored case, `runs` times."""
    entry = next(e for e in golden_files.index() if e.name == "gqa-113x203")
    values, _, _ = golden_files.load(golden_files.DEFAULT_DIR, entry, "cpu")
    subject = resolve(kernel)
    prints = []
    for _ in range(runs):
        q, k, v = (t.to(device).requires_grad_() for t in (values.q, values.k, values.v))
        out, lse = subject(q, k, v, entry.case)
        grads = torch.autograd.grad(out, (q, k, v), values.dout.to(device))
        h = hashlib.sha256()
        for t in (out, lse, *grads):
            h.update(t.detach().float().cpu().numpy().tobytes())
        prints.append(h.hexdigest())
    return prints


def _determinism(kernel: str, device: str) -> Check:
    label = f"determinism: {kernel}, 5 runs"
    try:
        with torch.cuda.device(device):
            prints = _fingerprint(kernel, device, 5)
    except Exception as e:  # reported, the other checks go on
        return Check(label, device, "Fail", f"{type(e).__name__}: {e}")
    if len(set(prints)) == 1:
        return Check(label, device, "Pass", f"identical bits, sha256 {prints[0][:12]}")
    return Check(label, device, "Fail", f"{len(set(prints))} different results in 5 runs")


def _cuda_build(device: str) -> Check:
    """Build (or load from the cache) the CUDA kernels for this GPU's architecture."""

    from faverify.kernels.cuda import build
    start = time.monotonic()
    try:
        capability = torch.cuda.get_device_capability(device)
        sm = build.arch(capability)
        build.load(capability)
    except Exception as e:  # nvcc missing or failing is this check's Fail, not the run's end
        return Check("build: cuda", device, "Fail", f"{type(e).__name__}: {str(e)[:300]}")
    return Check("build: cuda", device, "Pass", f"{sm} library ready in {time.monotonic() - start:.1f} s "
                                                 f"(nvcc, or the cache {build.cache_dir()})")


class _Checks(list):
    """The rows so far; each one is also shown as it lands (progress on stderr: a full run takes minutes)."""

    def append(self, check: Check, shown: bool = False) -> None:
        super().append(check)
        if not shown:
            _show(check)


def _show(check: Check) -> None:
    say(f"doctor: {check.check} on {check.device}: {check.status}")


def _judge_check(level: str, tolerance, device: str = "cpu") -> Check:
    """Every control (subjects/controls.py) on its cases, judged on its forward: each must fail. Quick: bf16
    alone."""
    dtypes = ("bf16",) if level == "quick" else ("bf16", "fp16", "fp32")
    holes, total = [], 0
    for name in controls.CONTROLS:
        for dtype in dtypes:
            for case in controls.cases(dtype, name):
                total += 1
                r = evaluate(controls.subject(name), case, device, mode="fwd", tolerance=tolerance)
                if r.status != "fail":
                    holes.append(f"{name} {r.status} on {case.short()}")
    if holes:
        return Check("judge self-test", device, "Fail", f"{len(holes)} of {total} control cases not failed: "
                                                        + "; ".join(holes[:3]))
    return Check("judge self-test", device, "Pass", f"{total} cases of {len(controls.CONTROLS)} wrong outputs "
                                                    "(zeros, a copy of v, NaN, ...) all failed")


def _libraries(requested: tuple) -> tuple:
    """(the requested library adapters that load here, a Skip naming the reason for each that does not)."""
    loaded, skipped = [], []
    for name in requested:
        try:
            resolve(name)
            loaded.append(name)
        except EnvironmentProblem as e:
            skipped.append(Check(f"golden: {name}", "-", "Skip", str(e)))
    return tuple(loaded), skipped


def run(level: str = "quick", *, tolerance, include_cpu: bool = True, libraries: tuple = ()) -> dict:
    """libraries: adapters of kernel libraries (subjects.registry.LIBRARIES) checked on every GPU beside
    the bundled kernels and the SDPA backends, against the golden cases each supports."""
    names = golden_files.QUICK if level == "quick" else None
    checks = _Checks()
    libraries, unloaded = _libraries(libraries)
    for c in unloaded:
        checks.append(c)
    if include_cpu:
        checks.append(_judge_check(level, tolerance))
        checks.append(_golden_check("sdpa-math", "cpu", names, tolerance, isolate=False))
        checks.append(_golden_check("triton", "cpu", names if level == "quick" else golden_files.QUICK, tolerance,
                                    isolate=True) if not torch.cuda.is_available()
                      else Check("golden: triton", "cpu", "Skip", "with a GPU the Triton kernels are compiled for it, "
                                                                       "not interpreted on the CPU"))
    gpus = environment.gpus()
    if not gpus:
        checks.append(Check("GPU", "-", "Warn", "no CUDA GPU is visible (torch.cuda.is_available() is False): "
                                                 "the GPU checks did not run"))
        for name in libraries:
            checks.append(Check(f"golden: {name}", "-", "Skip", "needs a CUDA GPU"))
    prints_by_model: dict = {}
    built = {}
    for g in gpus:  # before the golden workers start, which load the library from the cache
        built[f"cuda:{g['index']}"] = b = _cuda_build(f"cuda:{g['index']}")
        _show(b)
    golden_checks = _gpu_golden_checks({d: ("triton",) + (CUDA if b.status == "Pass" else ()) + SDPA + libraries
                                        for d, b in built.items()}, names, tolerance)
    for g in gpus:
        device = f"cuda:{g['index']}"
        where = f"{device} {g['name']}"
        checks.append(golden_checks[("triton", device)], shown=True)
        checks.append(built[device], shown=True)
        for kernel in CUDA:
            if built[device].status == "Pass":
                checks.append(golden_checks[(kernel, device)], shown=True)
            else:
                checks.append(Check(f"golden: {kernel}", device, "Skip", "the CUDA kernels did not build"))
        for kernel in SDPA + libraries:
            checks.append(golden_checks[(kernel, device)], shown=True)
        for kernel in ("triton",) + (("cuda",) if built[device].status == "Pass" else ()):
            det = _determinism(kernel, device)
            checks.append(det)
            if det.status == "Pass":
                prints_by_model.setdefault((g["name"], kernel), []).append((where, det.detail.rsplit(" ", 1)[-1]))
        for c in checks:
            if c.device == device:
                c.device = where
    for (model, kernel), prints in prints_by_model.items():
        if len(prints) < 2:
            continue
        values = [p for _, p in prints]
        majority = max(set(values), key=values.count)
        odd = [w for w, p in prints if p != majority]
        status = "Fail" if odd else "Pass"
        detail = (f"differs from the other {model} GPUs: {', '.join(odd)}" if odd
                  else f"{len(prints)} GPUs give identical bits")
        checks.append(Check(f"cross-GPU: {model}, {kernel}", "all", status, detail))
    return {"schema": "faverify.doctor", "version": 1, "level": level, "node": platform.node(),
            "environment": environment.collect(),
            "checks": [asdict(c) for c in checks],
            "failed": any(c.status == "Fail" for c in checks),
            "passed_any": any(c.status == "Pass" for c in checks)}
