"""Verdicts that cannot be fooled: references from pristine inputs, a subject's exits and foreign devices
blamed on the subject, capabilities refused when they do not make sense."""
import pytest
import torch

from faverify.cases.case import Case
from faverify.run.evaluate import evaluate
from faverify.subjects import resolve
from property_tests.cli_helpers import cli, read_json

CASE = Case(1, 33, 40, 2, 1, 16, dtype="fp32", seed=3)
CAUSAL = Case(1, 33, 40, 2, 1, 16, dtype="fp32", causal=True, seed=3)


@pytest.mark.parametrize("bug,tensor", [("zeroes_q", "q"), ("doubles_q", "q"), ("copies_v_into_k", "k"),
                                        ("zeroes_dout", "dout")])
def test_a_subject_that_changes_its_inputs_fails_on_the_untouched_inputs(bug, tensor):
    r = evaluate(resolve(f"property_tests.planted:{bug}"), CASE, "cpu")
    assert r.status == "fail" and f"{tensor}:modified" in r.signatures, (r.status, r.reason)
    n = CASE.batch * (CASE.seqlen_q if tensor in ("q", "dout") else CASE.seqlen_k) * (
        CASE.nheads if tensor in ("q", "dout") else CASE.nheads_k) * CASE.head_dim
    assert f"modified {tensor} in place: {n} elements" in r.reason
    # judged against references of the inputs as they were: the doubled q's output is wrong for the
    # q it was given, k overwritten by v likewise; zeroing q after the call leaves out right
    if bug in ("doubles_q", "copies_v_into_k"):
        assert "out:tolerance" in r.signatures, r.signatures
    if bug == "zeroes_q":  # in both modes autograd refuses the changed q; the forward alone is right
        fwd = evaluate(resolve(f"property_tests.planted:{bug}"), CASE, "cpu", mode="fwd")
        assert fwd.signatures == ["q:modified"] and fwd.metrics["out"].passed, (fwd.signatures, fwd.reason)


def test_a_declared_write_is_allowed():
    r = evaluate(resolve("property_tests.planted:writes_k_declared"), CASE, "cpu", mode="fwd")
    assert r.status == "pass", r.reason


def test_in_place_modification_is_found_shrunk_and_replayed(tmp_path):
    r = cli("fuzz", "--kernel", "property_tests.planted:doubles_q", "--iters", "30", "--device", "cpu", "--no-db",
            "--no-isolate", "--json", tmp_path / "run.json")
    assert r.exit_code == 1
    failures = read_json(tmp_path / "run.json")["kernels"][0]["failures"]
    modified = next(f for f in failures if f["signature"] == "q:modified")
    minimal = modified["minimal"]["case"]
    assert minimal["seqlen_q"] == 1 and minimal["batch"] == 1 and minimal["nheads"] == 1, minimal
    rep = cli("repro", "--kernel", "property_tests.planted:doubles_q", "--device", "cpu", "--case",
              Case.from_dict(minimal).to_json())
    assert rep.exit_code == 1 and "modified q in place" in rep.stdout
    golden = cli("golden", "verify", "--kernel", "property_tests.planted:doubles_q", "--device", "cpu",
                 "--only", "one-key,gqa-113x203")
    assert golden.exit_code == 1 and "modified q in place" in golden.stdout


@pytest.mark.parametrize("bug,message", [
    ("exits_zero", "forward raised SystemExit"),
    ("os_exits_zero", "the subject called os._exit(0)"),
    ("returns_on_meta", "out is on meta, expected the inputs' device cpu"),
])
def test_the_subject_is_blamed_in_this_process(bug, message):
    r = evaluate(resolve(f"property_tests.planted:{bug}"), CAUSAL, "cpu")
    assert r.status == "fail" and message in r.reason, r.reason


@pytest.mark.parametrize("declared,message", [
    ("5", "faverify_capabilities must be a dict"),
    ("{'dtypes': 'bf16'}", "dtypes must be a list of bf16, fp16, fp32, got 'bf16'"),
    ("{'gqa': 'no'}", "gqa must be true or false"),
    ("{'writes': ['out']}", "writes must be a list of q, k, v, dout"),
    ("{'max_head_dim': 0}", "max_head_dim must be an integer >= 1"),
    ("{'colour': 'red'}", "unknown key 'colour' (the keys: alibi, backward"),
    # the grouped keys (subjects/groups.py), by the names a declaration gives them
    ("{'mask': 'yes'}", "mask must be true or false, got 'yes'"),
    ("{'varlen': True, 'varlen_tail_grads': 'nan'}", "varlen_tail_grads must be zero or finite, got 'nan'"),
    ("{'paged': True, 'page_sizes': [16, 0]}", "page_sizes must be a list of integers >= 1, got [16, 0]"),
    ("{'splits': True, 'split_block': 0}", "split_block must be an integer >= 1, got 0"),
    ("{'fp8': ['row']}", "fp8 must be a list of tensor, head, block, got ('row',)"),
    ("{'fp8_only': True}", "fp8_only needs fp8"),
])
def test_capabilities_that_are_not_valid_are_refused_when_the_kernel_loads(tmp_path, monkeypatch, declared, message):
    module = f"badcaps_{abs(hash(declared))}"  # a module of its own per declaration: imports are cached
    (tmp_path / f"{module}.py").write_text(
        "def attn(q, k, v, *, causal, softmax_scale):\n    return q\n"
        f"attn.faverify_capabilities = {declared}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    r = cli("fuzz", "--kernel", f"{module}:attn", "--iters", "3", "--device", "cpu", "--no-db")
    assert r.exit_code == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_module_that_exits_at_import_is_exit_2_with_a_message(tmp_path, monkeypatch):
    (tmp_path / "exits_at_import.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    r = cli("fuzz", "--kernel", "exits_at_import:attn", "--iters", "3", "--device", "cpu", "--no-db")
    assert r.exit_code == 2 and "cannot import module 'exits_at_import': SystemExit" in r.stderr, r.stderr


def test_the_output_device_is_checked_for_the_gradients_too():
    from faverify.run.evaluate import on_device
    assert on_device("dq", torch.zeros(1, device="meta"), torch.device("cpu")) == \
        "dq is on meta, expected the inputs' device cpu"
    assert on_device("dq", torch.zeros(1), torch.device("cpu")) is None


CAUSAL_JSON = CAUSAL.to_json()


@pytest.mark.parametrize("bug,word", [("exits_zero", "SystemExit"), ("os_exits_zero", "called os._exit(0)"),
                                      ("segfaults", "died (exit code -11)")])
def test_repro_runs_the_subject_in_a_worker_and_never_exits_0_for_nothing(bug, word):
    r = cli("repro", "--kernel", f"property_tests.planted:{bug}", "--device", "cpu", "--case", CAUSAL_JSON)
    assert r.exit_code == 1 and word in r.stdout, r.stdout


def test_repro_of_a_hanging_subject_times_out():
    case = Case(1, 101, 8, 1, 1, 16, dtype="fp32", seed=1).to_json()
    r = cli("repro", "--kernel", "property_tests.planted:hangs", "--device", "cpu", "--timeout", "3", "--case", case)
    assert r.exit_code == 1 and "no result within 3 s" in r.stdout, r.stdout


@pytest.mark.parametrize("bug", ["exits_zero", "os_exits_zero"])
def test_an_exiting_subject_fails_in_process_too(bug, tmp_path):
    for command in (("fuzz", "--iters", "12", "--no-db", "--gradcheck-every", "0", "--shrink-budget", "3"),
                    ("golden", "verify", "--only", "seqlen-17-causal,one-key")):
        r = cli(*command, "--kernel", f"property_tests.planted:{bug}", "--device", "cpu", "--no-isolate")
        assert r.exit_code == 1, (command, r.exit_code, r.stderr[-1500:])


def test_a_keyboard_interrupt_raised_by_the_subject_in_a_worker_is_its_failure(tmp_path):
    r = cli("fuzz", "--kernel", "property_tests.planted:raises_keyboard_interrupt", "--iters", "10", "--device", "cpu",
            "--no-db", "--workers", "2", "--shrink-budget", "2", "--json", tmp_path / "run.json")
    failures = read_json(tmp_path / "run.json")["kernels"][0]["failures"]
    assert r.exit_code == 1 and failures, r.stderr
    assert all(f["signature"] == "error:KeyboardInterrupt" and "faverify raised" not in f["minimal"]["reason"]
               for f in failures), [(f["signature"], f["minimal"]["reason"][:80]) for f in failures]


def test_compare_of_a_run_that_checked_nothing_is_exit_2(tmp_path):
    cli("fuzz", "--kernel", "sdpa-math", "--iters", "5", "--device", "cpu", "--no-db", "--no-isolate",
        "--json", tmp_path / "ok.json")
    cli("fuzz", "--kernel", "property_tests.planted:declines_fp32", "--dtype", "fp32", "--iters", "5", "--device",
        "cpu", "--no-db", "--no-isolate", "--json", tmp_path / "none.json")
    assert read_json(tmp_path / "none.json")["kernels"][0]["summary"]["skipped"] == 5
    for args in (("ok.json", "none.json"), ("none.json", "ok.json")):
        r = cli("compare", *(tmp_path / a for a in args))
        assert r.exit_code == 2 and "checked no case (every case was skipped)" in r.stderr, r.stderr
    assert cli("compare", tmp_path / "ok.json", tmp_path / "ok.json").exit_code == 0


def test_repro_of_a_binary_case_file_is_a_usage_error(tmp_path):
    (tmp_path / "case.bin").write_bytes(bytes(range(256)))
    r = cli("repro", "--kernel", "sdpa-math", "--device", "cpu", "--case", f"@{tmp_path / 'case.bin'}")
    assert r.exit_code == 2 and "the file is not text" in r.stderr, r.stderr


@pytest.mark.parametrize("command", [("fuzz", "--kernel", "sdpa-math"), ("mutants",)])
@pytest.mark.parametrize("flag,value,message", [("--timeout", "nan", "must be a finite number of seconds >= 1"),
                                                ("--timeout", "-1", "must be a finite number of seconds >= 1"),
                                                ("--timeout", "1e-9", "must be a finite number of seconds >= 1"),
                                                ("--shrink-budget", "-1", "must be >= 0")])
def test_timeouts_and_budgets_are_validated_alike(command, flag, value, message):
    r = cli(*command, flag, value, "--device", "cpu")
    assert r.exit_code == 2 and f"{flag}=" in r.stderr and message in r.stderr, r.stderr


# Nothing the user asked to write is lost; every bad input is one line and exit 2.

@pytest.mark.parametrize("command", [("fuzz", "--kernel", "sdpa-math", "--iters", "3", "--no-db", "--device", "cpu"),
                                     ("mutants", "--only", "no-final-division", "--iters", "3", "--device", "cpu"),
                                     ("doctor",)])
@pytest.mark.parametrize("option", ["--json", "--markdown"])
def test_an_unwritable_output_is_refused_before_any_case_runs(tmp_path, command, option):
    if option == "--markdown" and command[0] != "fuzz":
        pytest.skip(f"{command[0]} writes no Markdown")
    (tmp_path / "a-file").write_text("x")
    for target, why in ((tmp_path / "a-file" / "run.json", "cannot be written"), (tmp_path, "is a directory")):
        r = cli(*command, option, target)
        assert r.exit_code == 2 and f"{option}=" in r.stderr and why in r.stderr, r.stderr
        assert "cases/s" not in r.stderr and "Traceback" not in r.stderr  # refused before the run


def test_golden_record_into_an_unwritable_directory_is_exit_2(tmp_path):
    (tmp_path / "a-file").write_text("x")
    r = cli("golden", "record", "--dir", tmp_path / "a-file" / "golden", "--only", "one-key")
    assert r.exit_code == 2 and "--dir=" in r.stderr and "cannot be written" in r.stderr, r.stderr


def test_golden_record_of_one_case_keeps_the_other_entries(tmp_path):
    import shutil

    from faverify.cases import golden_files
    copy = tmp_path / "golden"
    shutil.copytree(golden_files.DEFAULT_DIR, copy)
    before = [e.name for e in golden_files.index(copy)]
    r = cli("golden", "record", "--dir", copy, "--only", "one-key")
    assert r.exit_code == 0 and "recorded 1 cases" in r.stdout, r.stdout + r.stderr
    assert [e.name for e in golden_files.index(copy)] == before and len(before) == len(golden_files.CASES)
    r = cli("golden", "verify", "--kernel", "sdpa-math", "--device", "cpu", "--dir", copy, "--no-isolate")
    lse = sum(1 for c in golden_files.CASES.values() if c.lse_grad != "off")  # SDPA returns no lse: skipped
    assert r.exit_code == 0 and f"{len(before) - lse} of {len(before)} golden cases pass, 0 fail, {lse} skipped" \
        in r.stdout, r.stdout[-500:]


@pytest.mark.parametrize("index,message", [("[]", "not a version-1 golden index"),
                                           ('{"schema": "faverify.golden", "version": 1}', "an entry is not valid"),
                                           ('{"schema": "faverify.golden", "version": 1, "cases": [{"name": 1}]}',
                                            "an entry is not valid"),
                                           (None, "is a directory")])
def test_a_golden_index_that_is_not_one_is_exit_2(tmp_path, index, message):
    if index is None:
        (tmp_path / "index.json").mkdir()
    else:
        (tmp_path / "index.json").write_text(index)
    r = cli("golden", "verify", "--kernel", "sdpa-math", "--device", "cpu", "--dir", tmp_path)
    assert r.exit_code == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.fixture(scope="module")
def run_file(tmp_path_factory):
    """One run file with failures, made once for the damage tests below."""
    path = tmp_path_factory.mktemp("run") / "run.json"
    cli("fuzz", "--kernel", "property_tests.planted:wrong_scale", "--iters", "4", "--device", "cpu", "--no-db",
        "--shrink-budget", "1", "--no-isolate", "--json", path)
    return path


@pytest.mark.parametrize("damage,message", [
    (lambda d: d["kernels"][0].update(summary=None), "kernels[0].summary must be an object"),
    (lambda d: d["kernels"][0].update(stats=None), "kernels[0].stats must be a list"),
    (lambda d: d["kernels"][0]["failures"].__setitem__(0, {"signature": "x"}), "failures[0] is missing a field"),
    (lambda d: d["kernels"][0]["failures"][0]["minimal"].update(case={"batch": "x"}),
     "failures[0] is not a failure record"),
    (lambda d: d.update(environment=None), "environment must be an object"),
    (lambda d: d.update(kernels=[]), "kernels must be a non-empty list"),
])
def test_report_and_compare_of_a_damaged_run_file_are_one_line_errors(tmp_path, run_file, damage, message):
    import json
    data = read_json(run_file)
    assert data["kernels"][0]["failures"]
    damage(data)
    (tmp_path / "bad.json").write_text(json.dumps(data))
    for command in (("report", tmp_path / "bad.json"), ("compare", run_file, tmp_path / "bad.json")):
        r = cli(*command)
        assert r.exit_code == 2 and message in r.stderr and "Traceback" not in r.stderr, (command, r.stderr)


def test_report_of_a_directory_is_exit_2(tmp_path):
    r = cli("report", tmp_path)
    assert r.exit_code == 2 and "is a directory" in r.stderr


@pytest.mark.parametrize("args,message", [
    (("fuzz", "--seed", str(2**70)), "--seed="),
    (("fuzz", "--device", ""), "--device='': must be auto, cpu"),
    (("repro", "--kernel", "sdpa-math", "--case", '{"batch":1,"seqlen_q":1,"seqlen_k":1,"nheads":1,"nheads_k":1,'
      f'"head_dim":8,"seed":{2**70}}}'), "seed="),
])
def test_out_of_range_seeds_and_an_empty_device_are_one_line_errors(args, message):
    r = cli(*args)
    assert r.exit_code == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_an_interrupt_while_shrinking_keeps_the_failure(tmp_path, monkeypatch):
    """One worker (the sequential mode): the failure being shrunk when Ctrl-C lands is reported, as far as
    it was shrunk, with its reproducer, in the table and the JSON."""
    from faverify.run import shrink
    original = shrink.Shrinker.still_fails

    def interrupt_after_two_steps(self, case):
        if self.steps >= 2:
            raise KeyboardInterrupt
        return original(self, case)
    monkeypatch.setattr(shrink.Shrinker, "still_fails", interrupt_after_two_steps)
    r = cli("fuzz", "--kernel", "property_tests.planted:wrong_scale", "--iters", "20", "--device", "cpu", "--no-db",
            "--no-isolate", "--json", tmp_path / "run.json")
    run = read_json(tmp_path / "run.json")
    failures = run["kernels"][0]["failures"]
    assert r.exit_code == 1 and run["settings"]["interrupted"] is True, r.stderr
    assert len(failures) == 1 and "interrupted while shrinking" in failures[0]["note"]
    assert failures[0]["reproducer"].startswith("faverify repro") and "== Failures (1)" in r.stdout


def test_a_case_too_large_for_the_device_is_refused_with_the_estimate():
    huge = '{"batch":1,"seqlen_q":10000000,"seqlen_k":10000000,"nheads":1,"nheads_k":1,"head_dim":64}'
    r = cli("repro", "--kernel", "sdpa-math", "--device", "cpu", "--case", huge)
    assert r.exit_code == 2 and "too large for this device" in r.stderr, r.stderr


def test_drawn_cases_that_do_not_fit_are_skipped_with_the_reason(monkeypatch):
    from faverify.run import memory
    monkeypatch.setattr(memory, "CHECK_MEMORY_ABOVE", 0)
    monkeypatch.setattr(memory, "free_memory", lambda device: 1 << 20)  # 1 MiB free
    r = evaluate(resolve("sdpa-math"), CASE, "cpu")
    assert r.status == "skip" and "GiB free" in r.reason, r.reason
    monkeypatch.setattr(memory, "free_memory", lambda device: 1 << 40)
    assert evaluate(resolve("sdpa-math"), CASE, "cpu").status == "pass"


def test_the_memory_estimate_covers_what_the_reference_returns():
    """The estimate is at least the FP64 tensors the reference hands back plus the inputs, and grows with the
    sequence; it is what a case is refused by, so it must not undercount."""
    from faverify.cases.inputs import make_inputs
    from faverify.judge.reference import bytes_needed, reference
    case = Case(2, 300, 500, 4, 2, 48, dtype="bf16", seed=1)
    x = make_inputs(case, "cpu")
    ref, _ = reference(x.q, x.k, x.v, x.dout, causal=False, scale=case.scale)
    returned = sum(t.numel() * t.element_size() for t in ref.values() if t is not None)
    inputs = sum(t.numel() * t.element_size() for t in (x.q, x.k, x.v, x.dout))
    need = bytes_needed(2, 300, 500, 4, 2, 48, 2, "cpu", True)
    assert need >= returned + inputs
    assert bytes_needed(2, 3000, 5000, 4, 2, 48, 2, "cpu", True) - need >= 9 * (returned - 0)  # ~10x the rows
    assert bytes_needed(2, 300, 500, 4, 2, 48, 2, "cpu", False) < need  # no gradients: less


def test_an_unwritable_example_store_is_refused_before_any_case_runs(tmp_path):
    (tmp_path / "a-file").write_text("x")
    r = cli("fuzz", "--kernel", "sdpa-math", "--iters", "3", "--device", "cpu", "--db", tmp_path / "a-file" / "db")
    assert r.exit_code == 2 and "--db=" in r.stderr and "cannot be written" in r.stderr, r.stderr


def test_an_undecodable_golden_file_reads_the_same_with_and_without_isolation(tmp_path):
    """Bytes that match the index's sha256 but are no .npz: the same 'corrupt' row either way, not a crash
    of the worker in one and a row in the other."""
    import hashlib
    import json
    import shutil

    from faverify.cases import golden_files
    copy = tmp_path / "golden"
    shutil.copytree(golden_files.DEFAULT_DIR, copy)
    garbage = b"not an npz file at all"
    (copy / "cases" / "one-key.npz").write_bytes(garbage)
    index = json.loads((copy / "index.json").read_text())
    for e in index["cases"]:
        if e["name"] == "one-key":
            e["sha256"] = hashlib.sha256(garbage).hexdigest()
    (copy / "index.json").write_text(json.dumps(index))
    lines = []
    for isolate in ("--isolate", "--no-isolate"):
        r = cli("golden", "verify", "--kernel", "sdpa-math", "--device", "cpu", "--dir", copy, isolate,
                "--only", "one-key,gqa-113x203")
        assert r.exit_code == 2, r.stderr
        lines.append(next(line for line in r.stdout.splitlines() if line.startswith("one-key")).split())
    assert lines[0] == lines[1] and "corrupt" in lines[0], lines


def test_the_environment_header_leaves_triton_unimported():
    """The run's header reads package versions from their metadata: importing triton there, before the
    triton subject chose the interpreter, fixed triton in compiled mode and every CPU case of the kernels
    failed ("Cannot call @triton.jit'd outside of the scope of a kernel"), as in a mutants job process."""
    import os
    import subprocess
    import sys
    code = ("import sys; from faverify import env; env.collect(); assert 'triton' not in sys.modules; "
            "from faverify.cases.case import Case; from faverify.run.evaluate import evaluate; "
            "from faverify.subjects import resolve; "
            "r = evaluate(resolve('triton'), Case(1, 20, 20, 1, 1, 16, dtype='bf16', causal=True), 'cpu'); "
            "print(r.status, r.reason[:200])")
    environ = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=300)
    if torch.cuda.is_available():
        pytest.skip("on a GPU the kernels are compiled, not interpreted")
    assert r.returncode == 0 and r.stdout.startswith("pass"), r.stdout + r.stderr[-2000:]


def test_changed_inputs_are_counted_in_slices_as_in_one_pass():
    """The in-place check counts a pool of billions of elements slice by slice (side_effects.changed_elements):
    the count must be the one-pass count at any slice size, NaN equal to NaN, also for a strided view."""
    from faverify.run.side_effects import changed_elements
    g = torch.Generator().manual_seed(0)
    before = torch.randn(37, 5, 3, 8, generator=g)
    before[3, 1] = float("nan")
    now = before.clone()
    now[0, 0, 0, 0] = 1e9
    now[36, 4, 2, 7] = float("nan")  # NaN where there was a number: a change
    now[20:22] += 1.0  # 240 more
    for chunk in (1, 7, 120, 1 << 26):
        assert int(changed_elements(now, before, chunk)) == 242
        assert int(changed_elements(now[:, :, 1:], before[:, :, 1:], chunk)) == 161
