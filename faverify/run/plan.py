"""What a fuzz of one subject is asked to do: the cases it draws (FuzzPlan) and how each is judged, in this
process and in every worker alike (Judging); and the Hypothesis settings every draw of it is made under
(hypothesis_settings, seed_only). The draw (draw.py), the shrink (shrink.py) and both modes (sequential.py,
parallel.py) build on this module.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hypothesis import HealthCheck, Verbosity, settings

from faverify.cases import large
from faverify.cases.calls import sequences
from faverify.cases.case import Case
from faverify.cases.strategies import Limits, cases
from faverify.judge.verdict import DEFAULT_ATOL, DEFAULT_FACTOR, DEFAULT_TIGHT, Tolerance
from faverify.reports.case_result import CaseResult

Evaluate = Callable[[Case, bool], CaseResult]  # (case, with gradient check) -> result


# The shape budget of a subject that declares its compile key (Subject.compile_key) where the run names none:
# each configuration it compiles costs seconds (flex's 4 s a case on the CPU), a case's values milliseconds
COMPILE_SHAPES = 4


@dataclass(frozen=True)
class FuzzPlan:
    iters: int
    seed: int
    dtypes: tuple
    limits: Limits
    database: Path | None  # the example store (examples.py): failures found are replayed first next time
    gradcheck_every: int = 25  # 0: never
    shrink_budget: int = 300  # evaluations spent shrinking one failure
    shrink_seconds: float = 120.0
    stop_at_first_failure: bool = False  # `faverify mutants`: a mutant is killed by its first failure
    # strategies.cases' arguments that narrow the draw (`faverify mutants`: to the cases that run a mutant's
    # code, catalog.Mutant.cases); its dtypes are intersected with the plan's
    narrow: dict | None = None
    features: tuple = ()  # the variant features drawn (vocabulary.FEATURES); () draws dense cases only
    # (index, count): run only the cases i of the seed's draw with i % count == index (`--shard I/N`);
    # the shards of one seed and iters run every case once between them, whatever their workers
    shard: tuple | None = None
    # a shape budget (`--shapes N`): every case takes one of N shapes of the seed's own draw
    # (strategies.shape_pool), for subjects that compile or plan per shape; 0: none; None: COMPILE_SHAPES for
    # a subject that declares its compile key, none for the others
    shapes: int | None = 0
    # every distinct signature shrunk as a failure of its own (`--all-failures`); by default one failure per
    # root, its companions (the other signatures found on the same cases) reported with it (Roots)
    all_failures: bool = False
    # call sequences (`--sequence N`): each example up to N calls in one process (cases/calls.py); 0: one call
    sequence: int = 0
    # "large" (`--scale large`): cases whose flattened offsets cross 2^31 - 1 (cases/large.py) instead
    scale: str = "normal"

    def strategy(self):
        """What each example draws: a case, a call sequence ending in one, or a large case."""
        if self.scale == "large":
            return large.cases(**self.case_args())
        if self.sequence:
            return sequences(calls=self.sequence, **self.case_args())
        return cases(**self.case_args())

    def case_args(self) -> dict:
        args = dict(self.narrow or {}, limits=self.limits)
        args.setdefault("features", self.features)
        args["dtypes"] = tuple(d for d in self.dtypes if d in args.get("dtypes", self.dtypes))
        return args


DEFAULT_TIMEOUT = 300.0  # seconds: fuzz's and repro's own --timeout


@dataclass(frozen=True)
class Judging:
    """How each case is judged. mode: fwd, bwd or both; tolerance: the rule of judge/verdict.py; repeat: each
    case that many times, bit for bit ("nondeterministic"); measure: relations (run/relations.py) measured on
    every subject beside those it promises, failing nothing; timeout: the seconds a worker gives the subject's
    calls of one case."""
    mode: str = "both"
    tolerance: Tolerance = field(default_factory=Tolerance)
    repeat: int = 1
    measure: tuple = ()
    timeout: float = DEFAULT_TIMEOUT

    def to_dict(self) -> dict:
        """As a worker process is given it."""
        return {"mode": self.mode, "tolerance": self.tolerance.to_dict(), "repeat": self.repeat,
                "measure": list(self.measure), "timeout": self.timeout}

    @classmethod
    def from_dict(cls, d: dict) -> "Judging":
        return cls(d["mode"], Tolerance.from_dict(d["tolerance"]), d["repeat"], tuple(d["measure"]), d["timeout"])

    def flags(self, signature: str) -> tuple:
        """The options of `faverify repro` that judge a failure of this signature as this judging did: each
        setting that differs from repro's own default (the relations measured fail nothing: none)."""
        flags: list = [] if self.mode == "both" else ["--mode", self.mode]
        for option, values, defaults in (("--factor", self.tolerance.factor, DEFAULT_FACTOR),
                                         ("--atol", self.tolerance.atol, DEFAULT_ATOL),
                                         ("--tight", self.tolerance.tight, DEFAULT_TIGHT)):
            changed = [f"{t}={values[t]:g}" for t in defaults if values.get(t, defaults[t]) != defaults[t]]
            if changed:
                flags += [option, ",".join(changed)]
        if signature.startswith("gradcheck"):
            flags.append("--gradcheck")
        if self.repeat > 1:
            flags += ["--repeat", str(self.repeat)]
        if self.timeout != DEFAULT_TIMEOUT:
            flags += ["--timeout", f"{self.timeout:g}"]
        return tuple(flags)


def hypothesis_settings(*, examples: int, database, phases) -> settings:
    """The settings of every draw of a fuzz: `examples` cases, no health check, quiet."""
    return settings(max_examples=max(1, examples), deadline=None, database=database, phases=phases,
                    suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet,
                    report_multiple_bugs=False, print_blob=False)


# Two habits of Hypothesis's generation are left out of faverify's draws, for as long as any draw of this
# process runs (the parallel draw's thread and the shrinks' overlap):
# - it now and then draws a literal found in the source of the local modules loaded so far (its "local
#   constants"): which modules those are depends on the process (what it imported before the draw, an
#   editable install or a wheel, the caller's own code), so the same seed drew other cases after other
#   imports, and a replay could miss the case it replays;
# - after each new example it runs up to five mutations of it that copy one part of its choices over another
#   (ConjectureRunner.generate_mutations_from): five cases in six then repeat an earlier one's mask pattern,
#   page order or lengths. 150 CPU cases of sdpa-math held 125-136 distinct cases and left 9 to 18 of the
#   edges edges.py lists under 3 cases each (seeds 0-7); drawn without the mutations, 147-149 distinct cases
#   and at most 7 such edges, before the strategies' weights were set for them.
_CONSTANTS_LOCK = threading.Lock()
_constants_state: dict = {"depth": 0, "saved": None, "empty": None, "mutations": None}


@contextmanager
def seed_only():
    """Within it, a seeded Hypothesis draw depends on the seed and the strategies alone, each case drawn
    afresh. A Hypothesis without local constants or the mutator (or with them elsewhere) is left as it is
    there."""
    try:
        from hypothesis.internal.conjecture import engine, providers
        get, cache = providers._get_local_constants, providers.CONSTANTS_CACHE.cache
        runner = engine.ConjectureRunner
        runner.generate_mutations_from  # noqa: B018  (present, or the AttributeError below)
    except (ImportError, AttributeError):
        yield
        return
    state = _constants_state
    with _CONSTANTS_LOCK:
        if state["depth"] == 0:
            if state["empty"] is None:
                state["empty"] = providers.Constants()
            state["saved"] = get
            providers._get_local_constants = lambda: state["empty"]
            cache.clear()  # the permitted constants it cached were filtered from the local ones too
            state["mutations"] = runner.generate_mutations_from
            runner.generate_mutations_from = _no_mutations
        state["depth"] += 1
    try:
        yield
    finally:
        with _CONSTANTS_LOCK:
            state["depth"] -= 1
            if state["depth"] == 0:
                providers._get_local_constants = state["saved"]
                runner.generate_mutations_from = state["mutations"]
                cache.clear()


def _no_mutations(self, data) -> None:
    """ConjectureRunner.generate_mutations_from, left out of faverify's draws (above)."""
