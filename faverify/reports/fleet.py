"""A fleet table from many nodes' `faverify doctor --json` (`faverify merge`): a row per node, GPU and
check, and the outliers: a node whose bits on a deterministic check differ from what most nodes with the
same GPU model give. Each node's own verdicts stand as its doctor gave them."""
from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path

from faverify.errors import UsageError
from faverify.files import Unreadable, read_bounded
from faverify.reports.tables import table

SCHEMA = "faverify.doctor"
VERSIONS = (1,)  # the doctor report versions this faverify reads (doctor.py writes the newest)
CHECK_FIELDS = ("check", "device", "status", "detail")  # each a string in every check of a report


def read(path: Path) -> dict:
    try:
        data = json.loads(read_bounded(path))
    except Unreadable as e:
        raise UsageError("RUN.json", str(path), str(e)) from None
    except (ValueError, RecursionError) as e:
        raise UsageError("RUN.json", str(path), f"cannot be read as JSON ({type(e).__name__})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("checks"), list):
        raise UsageError("RUN.json", str(path), "is not a doctor report (faverify doctor --json)")
    if data.get("version") not in VERSIONS:
        raise UsageError("RUN.json", str(path), f"is a doctor report of version {data.get('version')!r}; this "
                                                f"faverify reads versions {', '.join(map(str, VERSIONS))}")
    for i, check in enumerate(data["checks"]):
        if not isinstance(check, dict) or not all(isinstance(check.get(f), str) for f in CHECK_FIELDS):
            raise UsageError("RUN.json", str(path), f"checks[{i}] must be an object whose "
                                                    f"{', '.join(CHECK_FIELDS)} are strings")
    for name in ("node",):
        if name in data and not isinstance(data[name], str):
            raise UsageError("RUN.json", str(path), f"{name} must be a string")
    env = data.get("environment", {})
    if not isinstance(env, dict) or not isinstance(env.get("gpus", []), list) or not all(
            isinstance(g, dict) and isinstance(g.get("name"), str) for g in env.get("gpus", [])):
        raise UsageError("RUN.json", str(path), "environment must be an object whose gpus each have a name")
    return data


def _model(device: str) -> str:
    return re.sub(r"^cuda:\d+\s*", "", device)


def fleet(named: list) -> dict:
    """named: [(path, doctor report)]. Rows carry `outlier` (a sentence, or "") beside each check."""
    rows, nodes, seen = [], [], Counter()
    for path, report in named:
        node = report.get("node") or Path(path).stem
        seen[node] += 1
        if seen[node] > 1:  # two reports of one node (run twice): keep both, told apart
            node = f"{node} ({Path(path).name})"
        env = report.get("environment", {})
        nodes.append({"node": node, "torch": env.get("torch"), "driver": env.get("driver"),
                      "gpus": ", ".join(g["name"] for g in env.get("gpus", [])) or "none"})
        rows += [{"node": node, "check": c["check"], "device": c["device"], "status": c["status"],
                  "detail": c["detail"], "outlier": ""} for c in report["checks"]]
    groups = defaultdict(list)
    for row in rows:
        bits = re.search(r"sha256 ([0-9a-f]+)", row["detail"])
        if row["check"].startswith("determinism:") and bits:
            groups[(row["check"], _model(row["device"]))].append((row, bits.group(1)))
    for (check, model), members in groups.items():
        counts = Counter(b for _, b in members)
        majority, n = counts.most_common(1)[0]
        for row, b in members:
            if b != majority:
                row["outlier"] = f"bits differ from {n} of {len(members)} nodes' {model}"
    return {"schema": "faverify.fleet", "version": 1, "nodes": nodes, "rows": rows,
            "failed": any(r["status"] == "Fail" or r["outlier"] for r in rows),
            "checked": sum(r["status"] in ("Pass", "Fail", "Warn") for r in rows)}


def render(result: dict, style: str = "table") -> str:
    failing = [r for r in result["rows"] if r["status"] == "Fail" or r["outlier"]]
    lead = (f"FAIL: {len(failing)} row(s) failing or outlying on {len({r['node'] for r in failing})} node(s)"
            if failing else f"PASS: {len(result['nodes'])} nodes, no check failing, no outlier"
            if result.get("checked", 1) else f"NOTHING CHECKED: {len(result['nodes'])} nodes, every check skipped")
    nodes = table([[n["node"], n["torch"] or "-", n["driver"] or "-", n["gpus"]] for n in result["nodes"]],
                  ["node", "torch", "driver", "GPUs"], style)
    rows = table([[r["node"], r["check"], r["device"], r["status"], r["outlier"] or "-", r["detail"][:120]]
                  for r in sorted(result["rows"], key=lambda r: (not (r["status"] == "Fail" or r["outlier"]),
                                                                r["node"]))],
                 ["node", "check", "device", "result", "outlier", "detail"], style)
    return "\n\n".join([("**" + lead.replace(":", ":**", 1)) if style == "md" else lead, nodes, rows]) + "\n"
