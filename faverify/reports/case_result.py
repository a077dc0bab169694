"""One case's result: its status, the reason, the metrics and signatures of what failed, and how it is
written to and read from a run file. The run makes them; the reports read them."""
from __future__ import annotations

import traceback
from dataclasses import dataclass, field

from faverify.cases.case import Case
from faverify.errors import printable
from faverify.judge.metrics import TensorMetrics

# "error": faverify's own code raised on the case (isolation.py): neither a pass nor a failure of the subject;
# the run says so and exits 2
STATUSES = ("pass", "fail", "skip", "crash", "timeout", "error")
OWN_ERROR = "faverify-error"  # the signature of a case faverify's own code raised on


@dataclass
class CaseResult:
    kernel: str
    case: Case
    status: str  # one of STATUSES; crash, timeout and error come from the worker (isolation.py)
    reason: str = ""
    metrics: dict = field(default_factory=dict)  # tensor -> TensorMetrics
    signatures: list = field(default_factory=list)  # e.g. ["out:tolerance", "dq:nan"]; empty unless failing
    gradcheck: dict | None = None  # gradcheck.GradCheck.to_dict()
    seconds: float = 0.0
    phases: dict = field(default_factory=dict)  # seconds per phase: inputs, subject, reference, ...
    device: str = ""
    paths: list = field(default_factory=list)  # the subject's code paths this case took (Subject.paths)
    relations: dict = field(default_factory=dict)  # relation -> its check on this case (run/relations.py)
    compiles: int = 0  # what the subject compiled for this case (Subject.compiles)
    compile_keys: list = field(default_factory=list)  # the configurations it needs (Subject.compile_key), as text
    # the cases the same process ran before this one, oldest first (isolation.Worker.history): what a failure
    # that passes alone may need before it; not written to the run file
    history: tuple = field(default=(), repr=False, compare=False)

    def __post_init__(self):  # a reason quotes what a kernel raised: its control characters and length are not ours
        self.reason = printable(self.reason)

    @property
    def failed(self) -> bool:
        return self.status in ("fail", "crash", "timeout")

    def to_dict(self) -> dict:
        return {"kernel": self.kernel, "case": self.case.to_dict(), "status": self.status, "reason": self.reason,
                "metrics": {k: m.to_dict() for k, m in self.metrics.items()}, "signatures": list(self.signatures),
                "gradcheck": self.gradcheck, "seconds": self.seconds, "phases": self.phases, "device": self.device,
                "paths": list(self.paths), "relations": self.relations, "compiles": self.compiles,
                "compile_keys": list(self.compile_keys)}

    @classmethod
    def from_dict(cls, d: dict) -> "CaseResult":
        return cls(kernel=d["kernel"], case=Case.from_dict(d["case"]), status=d["status"], reason=d["reason"],
                   metrics={k: TensorMetrics.from_dict(m) for k, m in d["metrics"].items()},
                   signatures=list(d["signatures"]), gradcheck=d.get("gradcheck"), seconds=d["seconds"],
                   phases=d.get("phases", {}), device=d.get("device", ""), paths=list(d.get("paths", [])),
                   relations=dict(d.get("relations", {})), compiles=d.get("compiles", 0),
                   compile_keys=list(d.get("compile_keys", [])))


def failure(kernel: str, case: Case, status: str, reason: str, signature: str, device: str = "") -> CaseResult:
    return CaseResult(kernel=kernel, case=case, status=status, reason=reason, signatures=[signature], device=device)


def own_error(kernel: str, case: Case, error: BaseException, device: str = "") -> CaseResult:
    """The result of a case on which faverify's own code raised: its error, not the subject's failure."""
    where = traceback.format_exception(type(error), error, error.__traceback__, limit=-3)
    return CaseResult(kernel=kernel, case=case, status="error", device=device, signatures=[],
                      reason=f"faverify raised {type(error).__name__}: {error}\n" + "".join(where[-4:-1]).rstrip())


# The skips for memory (out of memory making a case's inputs or its reference, or too large for what was
# free): on a GPU shared with other workers they say what those held at the time, not what the case needs
MEMORY_SKIPS = ("out of memory ", "too large for this device")


def skipped_for_memory(result: CaseResult) -> bool:
    return result.status == "skip" and result.reason.startswith(MEMORY_SKIPS)
