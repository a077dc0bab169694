"""The run document: what `fuzz --json` writes and `report`/`compare` read. Versioned; see docs/run-schema.md."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from faverify.collector import Failure, KernelStats
from faverify.errors import UsageError

SCHEMA = "faverify.run"
VERSION = 1


@dataclass
class Run:
    command: str
    environment: dict
    settings: dict
    tolerance: dict
    kernels: list = field(default_factory=list)  # per kernel: summary, stats, gradcheck, failures

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
        return any(k["summary"]["failed"] for k in self.kernels)

    @property
    def ran(self) -> int:
        return sum(k["summary"]["cases"] - k["summary"]["skipped"] for k in self.kernels)

    def failures(self) -> list:
        return [Failure.from_dict(f) for k in self.kernels for f in k["failures"]]

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "version": VERSION, "command": self.command, "environment": self.environment,
                "settings": self.settings, "tolerance": self.tolerance, "kernels": self.kernels}

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_finite(self.to_dict()), indent=1) + "\n")

    @classmethod
    def read(cls, path: Path, *, argument: str = "RUN") -> "Run":
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise UsageError(argument, str(path), "file does not exist") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UsageError(argument, str(path), f"is not valid JSON ({e})") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise UsageError(argument, str(path), f"is not a faverify run file (schema must be {SCHEMA!r})")
        if data.get("version") != VERSION:
            raise UsageError(argument, str(path), f"has run schema version {data.get('version')!r}; "
                                                  f"this faverify reads version {VERSION}")
        try:
            run = cls(data["command"], data["environment"], data["settings"], data["tolerance"], data["kernels"])
            for k in run.kernels:
                k["summary"]["kernel"], k["stats"], k["gradcheck"], k["failures"]  # noqa: B018 (shape check)
        except (KeyError, TypeError) as e:
            raise UsageError(argument, str(path), f"is missing a field the schema requires ({e})") from None
        return run


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
