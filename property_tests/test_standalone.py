"""`faverify repro --standalone FILE.py`: a script that runs the case with torch and the subject alone."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from property_tests.cli_helpers import cli

ROOT = Path(__file__).resolve().parents[1]
CASE = {"batch": 2, "seqlen_q": 9, "seqlen_k": 13, "nheads": 4, "nheads_k": 2, "head_dim": 16, "dtype": "bf16",
        "causal": True, "seed": 3, "layout": "transposed"}


def _without_faverify(script: Path):
    """Run the script with plain python where `import faverify` fails, from the repository's root (where the
    planted subjects' package is found)."""
    runner = (f"import sys, runpy; sys.modules['faverify'] = None; sys.argv = [{str(script)!r}]; "
              f"runpy.run_path({str(script)!r}, run_name='__main__')")
    return subprocess.run([sys.executable, "-c", runner], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("kernel, code", [("property_tests.planted:wrong_scale", 1),
                                          ("property_tests.planted:correct", 0), ("sdpa-math", 0)])
def test_the_script_runs_without_faverify_and_exits_1_while_the_bug_is_there(tmp_path, kernel, code):
    script = tmp_path / "repro_case.py"
    r = cli("repro", "--kernel", kernel, "--device", "cpu", "--case", json.dumps(CASE), "--standalone", script)
    assert r.exit_code == code, r.stdout
    text = script.read_text()
    assert "import faverify" not in text and "from faverify" not in text
    assert (tmp_path / "repro_case.pt").exists()
    ran = _without_faverify(script)
    assert ran.returncode == code, ran.stdout + ran.stderr
    if code:  # the wrong tensor, where, and what was expected there
        assert "out: FAIL, max error" in ran.stdout and " at [" in ran.stdout and "expected" in ran.stdout, ran.stdout
    else:
        assert "FAIL" not in ran.stdout and "out: pass" in ran.stdout, ran.stdout
    assert "torch " in ran.stdout  # the version block
    # each line's max error is the one it measured: the expected and observed values printed beside it
    lines = re.findall(r"(\w+): (?:pass|FAIL), max error (\S+) at \[[^]]*\]: expected (\S+), observed (\S+); "
                       r"beyond the tensor's own rounding (\S+), allowed (\S+)", ran.stdout)
    assert {name for name, *_ in lines} >= {"out", "dq", "dk", "dv"}, ran.stdout
    for name, error, expected, observed, beyond, allowed in lines:
        assert float(error) == pytest.approx(abs(float(expected) - float(observed)), rel=0.05, abs=1e-5), name
        assert float(error) > 0 and 0 <= float(beyond) <= float(error), (name, ran.stdout)


def test_a_case_the_script_cannot_express_is_refused_before_it_runs(tmp_path):
    windowed = {**CASE, "window": [2, 0]}
    r = cli("repro", "--kernel", "sdpa-math", "--device", "cpu", "--case", json.dumps(windowed),
            "--standalone", tmp_path / "r.py")
    assert r.exit_code == 2 and "--standalone" in r.stderr and "window" in r.stderr, r.stderr
    assert not (tmp_path / "r.py").exists()
    r = cli("repro", "--kernel", "combine", "--device", "cpu", "--case", json.dumps(CASE), "--standalone",
            tmp_path / "r.py")
    assert r.exit_code == 2 and "has no standalone call" in r.stderr, r.stderr


def test_the_flash_attn_4_script_calls_the_library_as_its_users_do():
    """Written for a GPU with flash-attn-4 (not run here): the script compiles, imports the library's own
    function and no faverify, and compares out and lse (flash-attn 4's lse is faverify's: [b, h, sq], base
    e). A subject whose lse follows other conventions has its lse left out."""
    from types import SimpleNamespace

    import torch

    from faverify.cases.case import Case
    from faverify.commands.standalone import script
    from faverify.reports.case_result import CaseResult
    from faverify.subjects.base import Capabilities, Subject
    from faverify.subjects.flash_attn_4 import STANDALONE
    subject = Subject("flash-attn-4", fn=None, caps=Capabilities.of(lse=True, conventions="flash-attn-4"),
                      standalone=STANDALONE)
    case = Case.from_dict(CASE)
    metrics = {t: SimpleNamespace(allowed=0.01) for t in ("out", "lse")}  # what the script reads of them
    text = script(subject, case, CaseResult("flash-attn-4", case, "fail", metrics=metrics), torch.device("cuda"),
                  "r.pt")
    compile(text, "r.py", "exec")
    assert "from flash_attn.cute import flash_attn_func" in text
    assert "import faverify" not in text and "from faverify" not in text
    assert "ALLOWED = {'out': 0.01, 'lse': 0.01}" in text
    other = Subject("lse-base-2", fn=None, caps=Capabilities.of(lse=True, conventions={"lse_base": "2"}),
                    standalone=STANDALONE)
    assert "ALLOWED = {'out': 0.01}" in script(other, case, CaseResult("x", case, "fail", metrics=metrics),
                                               torch.device("cuda"), "r.pt")


def test_the_upstream_reports_name_scripts_that_run_without_faverify():
    """docs/upstream: each report names a function of its library's script, and the script imports torch and
    the library alone."""
    import ast
    import pathlib
    import re
    folder = pathlib.Path(__file__).resolve().parent.parent / "docs" / "upstream"
    script = folder / "flash_attn_4_repro.py"
    tree = ast.parse(script.read_text())
    imported = {(n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
                for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    assert imported == {"subprocess", "sys", "torch", "flash_attn", "importlib"}, imported
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    named = {re.search(r"python flash_attn_4_repro\.py (\w+)", p.read_text()).group(1)
             for p in folder.glob("flash-attn-4-*.md")}
    defects = re.search(r"DEFECTS = \{f\.__name__: f for f in \(([^)]*)\)", script.read_text()).group(1)
    assert len(named) == 7 and named <= functions and named == {n.strip() for n in defects.split(",")}, named
