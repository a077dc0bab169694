"""The run document: what `fuzz --json` writes and `report`/`compare` read. Versioned; see docs/run-schema.md."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from faverify.errors import UsageError
from faverify.files import Unreadable, read_bounded, replace_whole
from faverify.reports import run_schema
from faverify.reports.collector import Failure, KernelStats

SCHEMA = "faverify.run"
VERSION = 10
# older versions lack what later ones added (docs/run-schema.md); their readers fill the gaps with "-", and
# compare does not compare a statistic whose definition changed between the two runs' versions
READS = tuple(range(1, VERSION + 1))


@dataclass
class Run:
    command: str
    environment: dict
    settings: dict
    tolerance: dict
    kernels: list = field(default_factory=list)  # per kernel: summary, stats, gradcheck, failures
    version: int = VERSION  # of the file it was read from

    @classmethod
    def from_stats(cls, command: str, environment: dict, settings: dict, tolerance: dict,
                   stats: list) -> "Run":
        for s in stats:
            for f in s.failures:  # every case of the run that showed the signature, shrinking aside
                f.occurrences = max(1, s.signature_counts[f.signature])
        kernels = [{"summary": s.summary(), "stats": s.stat_rows(), "gradcheck": s.gradcheck_rows(),
                    "failures": [f.to_dict() for f in s.failures]} for s in stats]
        return cls(command, environment, settings, tolerance, kernels)

    @property
    def failed(self) -> bool:
        """A case of the draw failed, or a replayed one (examples.py) that the draw did not meet."""
        return any(k["summary"]["failed"] or k["failures"] for k in self.kernels)

    @property
    def errors(self) -> int:
        """Cases faverify's own code raised on (not the subjects' failures)."""
        return sum(k["summary"].get("errors", 0) for k in self.kernels)

    @property
    def ran(self) -> int:
        return sum(k["summary"]["cases"] - k["summary"]["skipped"] for k in self.kernels)

    def failures(self) -> list:
        return [Failure.from_dict(f) for k in self.kernels for f in k["failures"]]

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "version": VERSION, "command": self.command, "environment": self.environment,
                "settings": self.settings, "tolerance": self.tolerance, "kernels": self.kernels}

    def to_text(self) -> str:
        """The run file's text: JSON with NaN and Inf as strings."""
        return json.dumps(_finite(self.to_dict()), indent=1) + "\n"

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_whole(path, self.to_text())

    @classmethod
    def read(cls, path: Path, *, argument: str = "RUN") -> "Run":
        try:
            data = json.loads(read_bounded(path))
        except Unreadable as e:
            raise UsageError(argument, str(path), str(e)) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UsageError(argument, str(path), f"is not valid JSON ({e})") from None
        except (RecursionError, ValueError) as e:  # nested past the interpreter's limit, a number too long
            raise UsageError(argument, str(path), f"is not a run file ({type(e).__name__})") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise UsageError(argument, str(path), f"is not a faverify run file (schema must be {SCHEMA!r})")
        if data.get("version") not in READS:
            raise UsageError(argument, str(path), f"has run schema version {data.get('version')!r}; "
                                                  f"this faverify reads versions {', '.join(map(str, READS))}")
        problem = run_schema.problem(data) or _failure_problem(data["kernels"])
        if problem:
            raise UsageError(argument, str(path), f"is not a valid run file: {problem} (docs/run-schema.md)")
        return cls(data["command"], data["environment"], data["settings"], data["tolerance"], data["kernels"],
                   data["version"])


def _failure_problem(kernels: list) -> str | None:
    """A failure record the reports could not read back (its cases, its metrics), in words, or None."""
    for i, k in enumerate(kernels):
        for j, f in enumerate(k["failures"]):
            try:
                Failure.from_dict(f)
            except (KeyError, TypeError, AttributeError, ValueError) as e:  # UsageError (a bad case) is a ValueError
                return f"kernels[{i}].failures[{j}] is not a failure record ({type(e).__name__}: {e})"
    return None


def num(x) -> float:
    """Numbers as stored in run files, where NaN and Inf are strings."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _finite(x):
    """JSON has no NaN/Infinity: write them as strings, read back by float()."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if x != x else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


__all__ = ["Run", "SCHEMA", "VERSION", "KernelStats"]
