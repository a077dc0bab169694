"""Memory of the bundled kernels is O(seqlen): forward + backward at seqlen 65536, head dim 128 allocates
no seqlen^2 buffer (a 65536^2 score matrix alone would be 16 GiB in bf16)."""
import pytest
import torch

from faverify.cases.case import Case
from faverify.cases.inputs import make_inputs
from faverify.subjects import resolve


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["triton", "cuda"])
def test_memory_is_linear_in_seqlen(name):
    case = Case(1, 65536, 65536, 8, 8, 128, dtype="bf16", causal=True)
    subject = resolve(name)
    x = make_inputs(case, "cuda", requires_grad=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out, _ = subject(x.q, x.k, x.v, case)
    grads = torch.autograd.grad(out, (x.q, x.k, x.v), x.dout)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    needed = x.q.numel() * x.q.element_size() * 4  # out, dq, dk, dv (inputs and dout were allocated before)
    print(f"{name}: peak extra memory {peak / 2**20:.1f} MiB for {needed / 2**20:.1f} MiB of outputs and gradients "
          f"({peak / needed:.3f}x)")
    assert peak <= 1.2 * needed + (1 << 20) * 8, (peak, needed)
    assert all(torch.isfinite(g).all() for g in grads)


def test_a_gpu_worker_gives_back_the_memory_of_a_large_case_only():
    """memory.gives_back: a case past GIVE_BACK_ABOVE (or with a huge paged pool) hands its memory back to
    the device, for the workers beside this one; a small one keeps the allocator's cache (emptying it
    costs a device sync); on the CPU there is no cache to give back."""
    from faverify.run.memory import GIVE_BACK_ABOVE, bytes_needed_by, gives_back
    cuda = torch.device("cuda")
    small = Case(1, 128, 128, 2, 2, 64, dtype="bf16")
    large = Case.of(1, 1, 131072, 32, 4, 128, dtype="bf16", cache_seqlens=(131072,), page_size=16)
    assert bytes_needed_by(small, cuda, True) <= GIVE_BACK_ABOVE < bytes_needed_by(large, cuda, True)
    assert gives_back(large, cuda) and not gives_back(small, cuda)
    assert not gives_back(large, torch.device("cpu"))
