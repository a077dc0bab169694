"""How many torch operations faverify's own phases of a fuzz case run (inputs, subject, reference,
baseline, metrics, gradcheck), and which of them make the host wait for the device. On a GPU each operation
that is not a view is a kernel launch, and a small case is bound by its launches, not its arithmetic; a sync
stalls the worker until its queue drains. The subject's own calls are not counted; the "subject" phase is
faverify's checks around them.

    python3 devtools/op_census.py [--kernel sdpa-math] [--cases 60] [--device cpu] [--seed 0]
                                  [--gradcheck-every 25]

Draws the fuzz's cases for the kernel (its features, the device's limits), runs the first --cases it
does not skip, the gradient check every --gradcheck-every as the fuzz does, and prints each phase's
operations and syncs a case, then the syncs a case by the line of faverify that made them. A sync is a read
of a device value on the host: a scalar (item, float, int, bool of a tensor), a count that sizes a result
(nonzero, a boolean index), torch.equal, and a copy to the host (tolist, cpu, numpy: on the CPU these
dispatch nothing, so they are counted where faverify calls them, on any device). The phase clock's own
synchronize at each lap is not counted.
"""
import argparse
import collections
import traceback
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from faverify.cases.strategies import limits_for
from faverify.run import evaluate as runner
from faverify.run.draw import draw_cases
from faverify.run.plan import FuzzPlan
from faverify.subjects import resolve

# operations that only describe memory already there: no kernel
VIEWS = ("view", "expand", "permute", "transpose", "select", "slice", "unsqueeze", "squeeze", "alias", "detach",
         "reshape", "_unsafe_view", "as_strided", "t.default")
# operations that wait for the device: a scalar read, a count that sizes the result
SYNCS = ("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.is_nonzero", "aten.equal")
# the host copies a CPU tensor makes without dispatching (a CUDA one's copy to the host dispatches)
HOST_COPIES = ("tolist", "cpu", "numpy")


def _site() -> str:
    """faverify's line that made the current call."""
    here = [f for f in traceback.extract_stack(limit=24) if "/faverify/" in f.filename]
    return f"{here[-1].filename.rsplit('/', 1)[-1]}:{here[-1].lineno}" if here else "?"


class _Census(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.syncs: collections.Counter = collections.Counter()  # (operation, site) -> count, over the run
        self.phase_syncs = 0  # since the last lap
        self.counting = False  # inside faverify's part of a case (not the subject's calls)

    def sync(self, name: str) -> None:
        self.syncs[(name, _site())] += 1
        self.phase_syncs += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        self.ops[name] += 1
        boolean_index = name.startswith("aten.index.Tensor") and any(
            getattr(i, "dtype", None) == torch.bool for i in (args[1] if len(args) > 1 else ()) if i is not None)
        to_host = name.startswith("aten._to_copy") and str((kwargs or {}).get("device", "")) == "cpu" \
            and getattr(args[0], "is_cuda", False)
        if name.startswith(SYNCS) or boolean_index or to_host:
            self.sync(name)
        return func(*args, **(kwargs or {}))


def _counting_host_copies(census: _Census) -> None:
    """Count tolist, cpu and numpy where faverify calls them on a CPU tensor (on a CUDA one the copy
    dispatches and is counted there)."""
    for method in HOST_COPIES:
        original = getattr(torch.Tensor, method)

        def counted(self, *args, _original=original, _name=method, **kwargs):
            if census.counting and self.device.type == "cpu":
                census.sync(f"Tensor.{_name}")
            return _original(self, *args, **kwargs)
        setattr(torch.Tensor, method, counted)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel", default="sdpa-math")
    p.add_argument("--cases", type=int, default=60)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gradcheck-every", type=int, default=25)
    a = p.parse_args()
    warnings.simplefilter("ignore")
    subject = resolve(a.kernel)
    # the device's own limits: the counts hardly depend on the sizes, but the reference's rows go in chunks
    # of a byte budget (64 MiB on the CPU, 1 GiB on a GPU), and a long sequence on the CPU takes many
    plan = FuzzPlan(iters=a.cases * 4, seed=a.seed, dtypes=("bf16", "fp16"), limits=limits_for(a.device.split(":")[0]),
                    database=None, features=subject.caps.features(), narrow=subject.caps.draw() or None)
    census = _Census()
    per_phase: dict = collections.defaultdict(collections.Counter)
    syncs_per_phase: collections.Counter = collections.Counter()
    clock_lap = runner._Clock.lap

    def lap(clock, name):  # what ran since the last lap is this phase's
        per_phase[name].update(census.ops)
        syncs_per_phase[name] += census.phase_syncs
        census.ops.clear()
        census.phase_syncs = 0
        clock_lap(clock, name)

    def uncounted(fn):
        """fn's operations are the subject's own (and may be tensor subclasses): the subject's call, and
        its backward, which the runner asks autograd for."""
        def run(*args, **kwargs):
            census.counting = False
            try:
                with _disable_current_modes():
                    return fn(*args, **kwargs)
            finally:
                census.counting = True
        return run

    autograd_grad = torch.autograd.grad
    runner._Clock.lap, subject.call, torch.autograd.grad = lap, uncounted(subject.call), uncounted(autograd_grad)
    _counting_host_copies(census)
    done = 0
    for i, case in enumerate(draw_cases(plan)):
        census.ops.clear()
        census.phase_syncs = 0
        census.counting = True
        with census:
            checked = a.gradcheck_every > 0 and i % a.gradcheck_every == 0
            result = runner.evaluate(subject, case, a.device, gradcheck=checked)
        census.counting = False
        if result.status == "skip":
            continue
        done += 1
        if done == a.cases:
            break
    runner._Clock.lap, torch.autograd.grad = clock_lap, autograd_grad
    print(f"{a.kernel}, {done} cases on {a.device}: operations a case (all / that launch a kernel), syncs a case")
    for phase in ("inputs", "subject", "reference", "baseline", "metrics", "gradcheck"):
        ops = per_phase[phase]
        launching = sum(n for name, n in ops.items() if not any(v in name for v in VIEWS))
        print(f"  {phase:10s} {sum(ops.values()) / max(done, 1):7.1f} / {launching / max(done, 1):7.1f}"
              f"   {syncs_per_phase[phase] / max(done, 1):6.2f}")
    print(f"syncs a case: {sum(census.syncs.values()) / max(done, 1):.2f}" + ("" if census.syncs else " (none)"))
    for (name, where), n in census.syncs.most_common():
        print(f"  {n / max(done, 1):6.2f}  {name}  {where}")


if __name__ == "__main__":
    main()
