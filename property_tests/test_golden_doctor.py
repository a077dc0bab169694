"""golden record/verify and doctor."""
import json
import shutil

import numpy as np
import pytest

from faverify.cases import golden_files
from faverify.commands import golden
from faverify.judge.verdict import Tolerance
from property_tests.cli_helpers import cli, read_json


@pytest.mark.parametrize("kernel", ["sdpa-math", "triton"])
def test_golden_verify_passes_on_this_machine(kernel):
    device = "cuda" if kernel == "triton" and __import__("torch").cuda.is_available() else "cpu"
    r = cli("golden", "verify", "--kernel", kernel, "--device", device)
    assert r.exit_code == 0, r.stderr[-2000:]
    total = len(golden_files.CASES)
    if kernel == "sdpa-math":  # every variant; SDPA returns no lse, so no loss on it
        lse = _loss_on_lse()
        assert lse >= 1 and f"{total - lse} of {total} golden cases pass, 0 fail, {lse} skipped" in r.stdout
    else:  # every variant too, but head dims past 256 (the kernels' limit), skipped with the reason
        wide = sum(1 for c in golden_files.CASES.values() if max(c.head_dim, c.dv) > 256)
        assert wide >= 1
        assert f"{total - wide} of {total} golden cases pass, 0 fail, {wide} skipped" in r.stdout
        assert "outside 1..256" in r.stdout


def _loss_on_lse() -> int:
    """The golden cases with a loss on lse: skipped by a subject that returns no lse."""
    return sum(1 for c in golden_files.CASES.values() if c.lse_grad != "off")


@pytest.fixture
def copy(tmp_path):
    target = tmp_path / "golden"
    shutil.copytree(golden_files.DEFAULT_DIR, target)
    return target


@pytest.mark.parametrize("damage,word", [
    (lambda p: p.write_bytes(p.read_bytes()[:100]), "truncated or tampered"),
    (lambda p: p.write_bytes(p.read_bytes()[:-1] + bytes([p.read_bytes()[-1] ^ 1])), "truncated or tampered"),
    (lambda p: p.unlink(), "missing"),
])
def test_a_damaged_file_fails_by_name_and_the_rest_still_run(copy, damage, word):
    damage(copy / "cases" / "one-key.npz")
    r = cli("golden", "verify", "--kernel", "sdpa-math", "--device", "cpu", "--dir", copy, "--no-isolate")
    assert r.exit_code == 2 and "Traceback" not in r.stderr  # the check is broken, not the kernel
    line = next(line for line in r.stdout.splitlines() if line.startswith("one-key"))
    assert "corrupt" in line and "cases/one-key.npz" in line and word in line
    total = len(golden_files.CASES)
    assert f"{total - 1 - _loss_on_lse()} of {total} golden cases pass" in r.stdout
    assert "error: damaged golden files" in r.stderr and "cases/one-key.npz" in r.stderr.splitlines()[-1]
    # a kernel that fails a case exits 1 even when a file is damaged: the failure is the finding
    r = cli("golden", "verify", "--kernel", "property_tests.planted:wrong_scale", "--device", "cpu", "--dir", copy,
            "--no-isolate", "--only", "one-key,gqa-113x203")
    assert r.exit_code == 1, r.stderr


def test_a_missing_or_damaged_index_is_exit_2_naming_the_file(copy):
    for damage in (lambda p: p.unlink(), lambda p: p.write_text("{not json")):
        damage(copy / "index.json")
        r = cli("golden", "verify", "--kernel", "sdpa-math", "--device", "cpu", "--dir", copy)
        assert r.exit_code == 2 and "index.json" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_golden_files_load_without_unpickling(copy):
    entry = golden_files.index(copy)[0]
    import numpy as np
    with np.load(copy / entry.file, allow_pickle=False) as z:  # raises if anything needed unpickling
        assert "in_q" in z.files and "ref_out" in z.files


def test_record_is_deterministic(tmp_path):
    names = ["gqa-113x203", "masked-rows-1023x17"]
    a = golden.record(tmp_path / "a", names=names)
    b = golden.record(tmp_path / "b", names=names)
    assert [e["sha256"] for e in a] == [e["sha256"] for e in b]
    # The committed files are what record makes: the inputs bit for bit (they come from the seed), the FP64
    # reference to its last bits. Those depend on the CPU's BLAS kernels (1 ulp, 2e-16 of the largest
    # value, between two x86 CPUs), so the file hashes of another machine's recording may differ.
    for name in names:
        with np.load(tmp_path / "a" / "cases" / f"{name}.npz") as made, \
                np.load(golden_files.DEFAULT_DIR / "cases" / f"{name}.npz") as committed:
            assert made.files == committed.files
            for key in made.files:
                if key.startswith("in_"):
                    assert np.array_equal(made[key], committed[key]), (name, key)
                else:
                    x, y = made[key].astype(np.float64), committed[key].astype(np.float64)
                    finite = np.isfinite(y)
                    assert np.array_equal(finite, np.isfinite(x)) and np.array_equal(x[~finite], y[~finite])
                    size = max(float(np.abs(y[finite]).max(initial=0.0)), 1e-300)
                    assert np.abs(x[finite] - y[finite]).max(initial=0.0) <= 1e-13 * size, (name, key)


def test_doctor_without_a_gpu_warns_and_passes(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the no-GPU warning cannot be shown here")
    r = cli("doctor", "--json", tmp_path / "d.json")
    assert r.exit_code == 0, r.stdout
    report = read_json(tmp_path / "d.json")
    statuses = {(c["check"], c["status"]) for c in report["checks"]}
    assert ("GPU", "Warn") in statuses and ("golden: sdpa-math", "Pass") in statuses
    assert ("golden: triton", "Pass") in statuses
    for c in report["checks"]:  # the JSON mirrors the table
        assert c["check"] in r.stdout and c["status"] in r.stdout


def test_doctor_fails_when_a_check_fails(monkeypatch, tmp_path):
    from faverify.commands import doctor
    monkeypatch.setattr(doctor, "_golden_check",
                        lambda kernel, device, names, tol, isolate: doctor.Check(f"golden: {kernel}", device, "Fail",
                                                                                 "x"))
    r = cli("doctor")
    assert r.exit_code == 1 and "Fail" in r.stdout


def test_doctor_with_libraries_names_why_each_was_not_checked(monkeypatch, tmp_path):
    """--with: a library whose package does not import is a Skip naming the import error; one that
    imports (a stand-in here) is checked on every GPU, and on a machine without one is a Skip saying so."""
    import sys

    import torch

    from faverify.commands import doctor
    from property_tests import fake_libraries
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the library would be checked on it")
    package = type(sys)("flash_attn")
    package.cute = fake_libraries.flash_attn_cute([])
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", package.cute)
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import raises ImportError
    monkeypatch.setattr(doctor, "_golden_check",
                        lambda kernel, device, names, tol, isolate: doctor.Check(f"golden: {kernel}", device, "Pass",
                                                                                 "x"))
    r = cli("doctor", "--with", "flash-attn-4,flashinfer", "--json", tmp_path / "d.json")
    assert r.exit_code == 0, r.stdout + r.stderr
    rows = {c["check"]: c for c in read_json(tmp_path / "d.json")["checks"]}
    flashinfer, fa4 = rows["golden: flashinfer"], rows["golden: flash-attn-4"]
    assert flashinfer["status"] == "Skip" and "does not import here" in flashinfer["detail"]
    assert fa4["status"] == "Skip" and fa4["detail"] == "needs a CUDA GPU"
    r = cli("doctor", "--with", "flash-attn-5")
    assert r.exit_code == 2 and "--with" in r.stderr and "flash-attn-5" in r.stderr
    assert "each must be one of" in r.stderr
    # with a GPU (stood in for): the library's golden check runs on it beside the SDPA backends
    asked = {}

    def golden_checks(kernels_by_device, names, tolerance):
        asked.update(kernels_by_device)
        return {(k, d): doctor.Check(f"golden: {k}", d, "Pass", "x") for d, ks in kernels_by_device.items() for k in ks}

    monkeypatch.setattr(doctor.environment, "gpus", lambda: [{"index": 0, "name": "a GPU"}])
    monkeypatch.setattr(doctor, "_cuda_build", lambda device: doctor.Check("CUDA build", device, "Pass", "x"))
    monkeypatch.setattr(doctor, "_gpu_golden_checks", golden_checks)
    monkeypatch.setattr(doctor, "_determinism", lambda kernel, device: doctor.Check("determinism", device, "Pass", "x"))
    report = doctor.run("quick", tolerance=None, libraries=("flash-attn-4", "flashinfer"))
    assert asked["cuda:0"][-1] == "flash-attn-4" and "flashinfer" not in asked["cuda:0"], asked
    rows = {(c["check"], c["device"]): c["status"] for c in report["checks"]}
    assert rows[("golden: flash-attn-4", "cuda:0 a GPU")] == "Pass" and rows[("golden: flashinfer", "-")] == "Skip"


def test_golden_verify_usage_errors():
    r = cli("golden", "verify")
    assert r.exit_code == 2 and "--kernel" in r.stderr
    r = cli("golden", "verify", "--kernel", "sdpa-math", "--only", "nosuch")
    assert r.exit_code == 2 and "unknown golden case" in r.stderr
    assert json.loads((golden_files.DEFAULT_DIR / "index.json").read_text())["version"] == 1


def _rows(*bad):
    from faverify.cases.case import Case
    good = {"name": "ok", "status": "pass", "reason": "", "case": Case(1, 4, 4, 1, 1, 8)}
    return [good] + [{"name": n, "status": "fail", "reason": reason, "case": case} for n, case, reason in bad]


@pytest.mark.parametrize("kernel,bad,expected", [
    # the flash backend's NaN gradients at bf16-scale values: documented, a Warn that names it
    ("sdpa-flash", [("b", dict(regime="bf16-scale", dtype="bf16"), "dq: 64 NaN where the reference is finite")],
     "Warn"),
    # the same backend wrong on its output there, or wrong elsewhere: a Fail
    ("sdpa-flash", [("b", dict(regime="bf16-scale", dtype="bf16"), "out: 3 NaN where the reference is finite")],
     "Fail"),
    ("sdpa-flash", [("n", dict(regime="normal", dtype="bf16"), "dq: 4.1x the allowed error")], "Fail"),
    # a defect documented for another backend does not excuse this one
    ("sdpa-flash", [("m", dict(causal=True, seqlen_q=9, seqlen_k=3), "out: 2x the allowed error")], "Fail"),
    ("sdpa-cudnn", [("m", dict(causal=True, seqlen_q=9, seqlen_k=3), "out: 2x the allowed error")], "Warn"),
    ("triton", [("b", dict(regime="bf16-scale", dtype="bf16"), "dq: 64 NaN where the reference is finite")], "Fail"),
])
def test_doctor_warns_only_for_a_backends_documented_defects(monkeypatch, kernel, bad, expected):
    from faverify.cases.case import Case
    from faverify.commands import doctor, golden
    from faverify.judge.verdict import Tolerance
    rows = _rows(*[(n, Case(**{**dict(batch=1, seqlen_q=4, seqlen_k=4, nheads=1, nheads_k=1, head_dim=8), **fields}),
                        reason) for n, fields, reason in bad])
    monkeypatch.setattr(golden, "verify", lambda *a, **k: rows)
    check = doctor._golden_check(kernel, "cuda:0", None, Tolerance(), isolate=False)
    assert check.status == expected, check.detail
    if expected == "Warn":
        assert "known defect" in check.detail and "docs/torch-backends.md" in check.detail


def test_many_checks_at_once_each_in_its_own_workers(copy):
    """golden.verify_many (doctor's GPU checks): several subjects together, one spread over two workers;
    each job's rows come back in the index's order, a damaged file is a row of every job."""
    names = ["seqlen-17-causal", "gqa-113x203", "head-dim-24-batch-2", "outliers-fp16", "mqa-128"]
    (copy / "cases" / "gqa-113x203.npz").write_bytes(b"not a file")
    done = []
    got = golden.verify_many([("sdpa-math", "cpu", 2), ("property_tests.planted:wrong_scale", "cpu", 1)],
                             directory=copy, tolerance=Tolerance(), names=names,
                             on_done=lambda k, d, rows: done.append(k))
    order = [e.name for e in golden_files.index(copy) if e.name in names]
    assert sorted(done) == sorted(["sdpa-math", "property_tests.planted:wrong_scale"])
    math_rows, wrong_rows = got[("sdpa-math", "cpu")], got[("property_tests.planted:wrong_scale", "cpu")]
    assert [r["name"] for r in math_rows] == [r["name"] for r in wrong_rows] == order
    for rows, healthy in ((math_rows, "pass"), (wrong_rows, "fail")):
        assert {r["name"]: r["status"] for r in rows} == {n: "corrupt" if n == "gqa-113x203" else healthy
                                                          for n in names}
