"""Memory and work a case needs, against what its device has free: a case too large is skipped with the
reason, and a GPU worker hands back what a large case took."""
from __future__ import annotations

import torch

from faverify.cases.case import Case
from faverify.cases.large import ACCUMULATOR_ROWS, judged_entries
from faverify.dtypes import TORCH
from faverify.judge.reference import bytes_needed

CHECK_MEMORY_ABOVE = 256 << 20  # bytes: a smaller case is not worth asking the device how much is free


# bytes: a GPU worker hands the memory of a case that took more back to the device (gives_back); twice the
# reference's chunk of temporaries (1 GiB on a GPU), which every case's estimate counts whole
GIVE_BACK_ABOVE = 2 << 30


def gives_back(case: Case, device) -> bool:
    """Whether a GPU worker hands the memory of a case it has run back to the device: one that took more
    than GIVE_BACK_ABOVE, or drew a paged pool past 2^31 elements (emptying the cache syncs the device, not
    worth it for the many small cases). The caching allocator keeps it otherwise, and the workers beside
    this one find it taken: a 2000-case triton-paged fuzz on the H200 (6 workers, each keeping what its
    cases had taken) skipped 72 cases for memory, 0.1-29 GiB of 139 free when each was drawn."""
    device = torch.device(device)
    return device.type == "cuda" and (bool(case.paged is not None and case.paged.pool)
                                      or bytes_needed_by(case, device, backward=True) > GIVE_BACK_ABOVE)


def bytes_needed_by(case: Case, device: torch.device, backward: bool) -> int:
    """About the device memory a case takes: its tensors, the reference's and, paged, the pools. A large
    case's reference covers the batch entries judged alone, and the subject's workspace counts."""
    itemsize = TORCH[case.dtype].itemsize
    judged = judged_entries(case)
    need = bytes_needed(case.batch, case.seqlen_q, case.seqlen_k, case.nheads, case.nheads_k, case.head_dim,
                        itemsize, device.type, backward, judged=None if judged is None else len(judged))
    if judged is not None:
        need += workspace(case, itemsize, backward)
    if case.paged is not None:  # the pools, k and v, twice (the inputs and their untouched copy)
        pages = case.paged.pool or case.pages_used + 1
        need += 2 * pages * case.paged.page_size * case.nheads_k * (case.head_dim + case.dv) * itemsize
    if case.varlen is not None:  # the tail's tokens of q, k, v and dO, in the inputs, copies and gradients
        token = case.nheads * (case.head_dim + case.dv) + case.nheads_k * (case.head_dim + case.dv)
        need += 4 * case.varlen.tail * token * itemsize
    return need


# multiply-adds of a case's FP64 reference past which it is refused: about an hour of a CPU's FP64 (1e10 a
# second), or of an H200's (1e13)
MAX_WORK = {"cpu": 1 << 45, "cuda": 1 << 55}


def work(case: Case) -> int:
    """The FP64 reference's multiply-adds: every row it is computed on against every key, forward and
    backward."""
    judged = judged_entries(case)
    pairs = sum(sq * sk for sq, sk in case.sequences) if judged is None else len(judged) * case.seqlen_q * case.seqlen_k
    return pairs * case.nheads * (case.head_dim + case.dv) * 4


def workspace(case: Case, itemsize: int, backward: bool) -> int:
    """The most a known subject's backward takes beside its inputs and outputs, for a dense case: an fp32 dq
    accumulator and two fp32 row statistics, each sequence padded to ACCUMULATOR_ROWS query rows
    (flash-attention's dq_accum, softmax_lse_log2 and softmax_d), and under GQA dk and dv per query head in
    the dtype, summed over the group after (flash-attention 2's dk_expanded and dv_expanded). Negligible
    beside the FP64 reference of an ordinary case; what decides whether a large one fits."""
    if not backward:
        return 0
    rows = case.batch * -(-case.seqlen_q // ACCUMULATOR_ROWS) * ACCUMULATOR_ROWS * case.nheads
    expanded = case.batch * case.seqlen_k * case.nheads * (case.head_dim + case.dv) if case.group > 1 else 0
    return 4 * rows * (case.head_dim + 2) + itemsize * expanded


def too_big(case: Case, device: torch.device, backward: bool) -> str | None:
    """Why the case cannot fit on the device (about what it would take, against what is free), or None.
    A drawn case that does not fit is skipped with this reason; `repro` of one is exit 2."""
    needed = work(case)
    if needed > MAX_WORK.get(device.type, MAX_WORK["cuda"]):
        return (f"too large for this device: its FP64 reference would take {needed:.2g} multiply-adds, more than "
                f"{MAX_WORK.get(device.type, MAX_WORK['cuda']):.2g} ({device.type})")
    need = bytes_needed_by(case, device, backward)
    if need <= CHECK_MEMORY_ABOVE:
        return None
    free = free_memory(device)
    if free is not None and need > free and device.type == "cuda":
        torch.cuda.empty_cache()  # what this process's allocator keeps from earlier cases is free to it
        free = free_memory(device)
    if free is None or need <= free:
        return None
    return (f"too large for this device: the case needs about {need / 2**30:.1f} GiB, "
            f"{device} has {free / 2**30:.1f} GiB free")


def free_memory(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
