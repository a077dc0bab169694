"""Compiling before the cases (run/warmup.py, run/precompile.py, kernels/triton/builds.py): the Triton
builds a fuzz needs are listed and compiled without a GPU, for the AOT target sm_90, each once; a fuzz's own
calls then need no build the warm-up did not list."""
import dataclasses
import os

import pytest

from faverify.cases.case import Case
from faverify.cases.strategies import limits_for
from faverify.run.draw import draw_cases
from faverify.run.plan import FuzzPlan
from faverify.run.warmup import Request, precompile
from faverify.subjects import resolve
from property_tests import test_compiles
from property_tests.cli_helpers import cli, read_json

TARGET = "sm_90"


def _listed(request: Request, jobs: int = 2):
    done = precompile(dataclasses.replace(request, target=TARGET, jobs=jobs, compile=False))
    assert not done.error and not done.untraced, (done.error, done.untraced[:3])
    return done


@pytest.mark.slow
@pytest.mark.parametrize("kernel, iters", [("triton", 150), ("triton-varlen", 40), ("triton-paged", 40)])
def test_a_fuzz_compiles_no_build_its_warm_up_did_not_list(kernel, iters):
    """Every build a seeded fuzz's calls launch on sm_90 (each case judged as the fuzz judges it, the gradient
    check every 25th) is one the warm-up lists: a build it missed would compile in every GPU worker that
    meets it. Listed by Triton's own cache keys, under the named target, on the CPU."""
    seed = 11
    print(f"seed {seed}")
    subject = resolve(kernel)
    features = subject.caps.features()
    plan = FuzzPlan(iters=iters, seed=seed, dtypes=("bf16", "fp16"), limits=limits_for("cuda", 256),
                    database=None, features=features, narrow=subject.caps.draw() or None)
    cases = draw_cases(plan)
    warm = _listed(Request(kernel, "both", ("bf16", "fp16"), features, True))
    drawn = _listed(Request(kernel, "both", cases=tuple(c.to_dict() for c in cases), judged=True,
                            checked=tuple(range(0, len(cases), 25))))
    assert drawn.built
    missed = [b["kernel"] for b in drawn.built if b["key"] not in set(warm.keys)]
    assert not missed, (len(missed), sorted(set(missed)))


@pytest.mark.slow
def test_each_build_compiles_once_and_a_second_warm_up_only_loads(tmp_path):
    """Two processes list cases that share their builds: each build is compiled by one of them, once, into
    the cache directory Triton keys it by; a second warm-up finds every build there and compiles none."""
    cases = tuple(Case(1, 97, 97, 2, 1, 16, dtype="bf16", causal=causal, seed=seed).to_dict()
                  for seed in (0, 1) for causal in (False, True))
    request = Request("triton", "fwd", cases=cases, target=TARGET, jobs=2)
    first = precompile(request, str(tmp_path))
    assert not first.error and not first.untraced and not first.failed, (first.error, first.untraced)
    assert first.count("compiled") == first.compiles == len(set(first.keys)) == 2, first.to_dict()
    assert {k for k in os.listdir(tmp_path)} == set(first.keys)
    second = precompile(request, str(tmp_path))
    assert second.keys == first.keys and second.count("cached") == 2 and second.compiles == 0


@pytest.mark.slow
def test_a_builds_key_does_not_follow_the_order_of_the_launches():
    """The same builds listed in two orders, each in one process, have the same keys (common.settle_keys):
    Triton keyed a kernel by the order in which a process first reached its helpers, and the warm-up's
    order is not a worker's."""
    cases = [Case(1, 97, 97, 2, 1, d, dtype="bf16", causal=True).to_dict() for d in (64, 63)]
    one = _listed(Request("triton", cases=tuple(cases)), jobs=1)
    other = _listed(Request("triton", cases=tuple(reversed(cases))), jobs=1)
    assert len(one.keys) == 8 and set(one.keys) == set(other.keys)


def test_the_warm_up_command_refuses_what_it_cannot_do(tmp_path):
    r = cli("warmup", "--target", "sm_9x")
    assert r.exit_code == 2 and "--target='sm_9x'" in r.stderr, r.stderr
    r = cli("warmup", "--kernel", "triton-paged", "--target", "sm_90", "--features", "bias")
    assert r.exit_code == 2 and "does not declare bias" in r.stderr, r.stderr
    r = cli("warmup", "--kernel", "sdpa-math", "--target", "sm_90", "--cache-dir", tmp_path / "cache")
    assert r.exit_code == 2 and "declares no warm-up" in r.stderr, r.stderr
    if not os.environ.get("CUDA_VISIBLE_DEVICES") and not _gpu():
        r = cli("warmup")
        assert r.exit_code == 2 and "no GPU" in r.stderr, r.stderr


def _gpu() -> bool:
    import torch
    return torch.cuda.is_available()


class _Instant(test_compiles._Instant):
    """test_compiles' worker on a device, whose result for a task is a CaseResult, a warm one with one compile."""
    device, process = "cpu", None

    def collect(self):
        from faverify.reports.case_result import CaseResult
        task = super().collect()
        return CaseResult("x", task.case, "skip" if task.warm else "pass", compiles=int(task.warm))


def test_the_warm_up_of_a_compile_key_is_one_case_per_key_on_the_worker_that_keeps_it():
    """A subject that compiles per configuration warms the first drawn case of each key over every worker,
    counting what they compiled; then the pool keeps fewer, and each key's cases go to the kept worker that
    compiled it."""
    from faverify.reports.collector import KernelStats
    from faverify.run.isolation import Task
    from faverify.run.scheduler import Pool
    from faverify.run.warmup import warm_up

    cases = [Case(1, 4, 4, 1, 1, d, seed=i) for i, d in enumerate((16, 32, 16, 64, 32, 16, 64, 32))]
    workers = [_Instant() for _ in range(3)]
    pool, stats = Pool(list(workers)), KernelStats("x")
    queue = warm_up(pool, [], stats, 2, iter([(i, Task(c)) for i, c in enumerate(cases)]),
                    key=lambda case: (case.head_dim,))
    warmed = {w: {t.case.head_dim for t in w.ran} for w in workers}
    assert sorted(t.case.head_dim for w in workers for t in w.ran) == [16, 32, 64]  # once a key, all warm
    assert all(t.warm for w in workers for t in w.ran)
    assert stats.warmup_cases == 3 and stats.compiles == stats.warmup_compiles == 3 and pool.workers == workers[:2]
    for w in workers:
        w.ran = []
    pool.map(queue, lambda i, result: None)
    assert sorted(t.case.seed for w in workers for t in w.ran) == list(range(len(cases)))
    for w in workers[:2]:  # a key a kept worker compiled runs there alone
        assert {t.case.head_dim for t in w.ran} >= warmed[w]
        other = workers[1 - workers.index(w)]
        assert not warmed[w] & {t.case.head_dim for t in other.ran}


@pytest.mark.slow
def test_flex_compiles_each_configuration_once_over_two_workers(tmp_path):
    """flex compiles each configuration on the CPU through inductor (seconds each): over two workers, the
    warm-up compiles each configuration the draw needs, once. (A worker left idle may still take a case of a
    configuration the other compiled, scheduler.Affinity, and compile it again.)"""
    r = cli("fuzz", "--kernel", "flex", "--iters", "8", "--device", "cpu", "--workers", "2", "--no-db",
            "--features", "none", "--shapes", "2", "--seed", "3", "--json", tmp_path / "run.json")
    assert r.exit_code == 0, r.stderr
    summary = read_json(tmp_path / "run.json")["kernels"][0]["summary"]
    configurations = len(summary["configurations"])
    assert configurations > 1 and summary["warmup"]["cases"] == configurations, summary["warmup"]
    assert summary["warmup"]["compiles"] == configurations, (summary["warmup"], summary["configurations"])
