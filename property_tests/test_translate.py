"""The translations of a case's keywords into other libraries' vocabularies, against hand-worked cases and
against faverify's own paged inputs."""
import pytest
import torch

from faverify.cases.case import Case
from faverify.cases.inputs import make_inputs
from faverify.errors import Unsupported
from faverify.subjects.translate import flash_attn_4_window, flashinfer_paged, flashinfer_window


def test_flashinfer_page_table_by_hand():
    table = torch.tensor([[5, 2, 9], [7, 0, 0]], dtype=torch.int32)
    indptr, indices, last = flashinfer_paged(table, torch.tensor([40, 16], dtype=torch.int32), 16)
    assert indptr.tolist() == [0, 3, 4] and indices.tolist() == [5, 2, 9, 7] and last.tolist() == [8, 16]
    assert {t.dtype for t in (indptr, indices, last)} == {torch.int32}
    indptr, indices, last = flashinfer_paged(torch.tensor([[3, 1, 4]], dtype=torch.int32),
                                             torch.tensor([3], dtype=torch.int32), 1)
    assert indptr.tolist() == [0, 3] and indices.tolist() == [3, 1, 4] and last.tolist() == [1]


def test_an_empty_cache_is_unsupported_by_flashinfer():
    with pytest.raises(Unsupported) as e:
        flashinfer_paged(torch.zeros(2, 2, dtype=torch.int32), torch.tensor([5, 0], dtype=torch.int32), 4)
    assert "kv_last_page_len must be 1..page_size" in str(e.value)


@pytest.mark.parametrize("pages", ["in-order", "reverse", "random", "shared"])
def test_the_flashinfer_table_reads_each_sequence_s_own_keys(pages):
    """Keys gathered through (kv_indptr, kv_indices, kv_last_page_len) are the keys the reference reads."""
    case = Case.of(3, 2, 45, 2, 1, 16, dtype="fp32", cache_seqlens=(45, 13, 32), page_size=8, pages=pages, seed=4)
    x = make_inputs(case, "cpu")
    indptr, indices, last = flashinfer_paged(x.block_table, x.cache_seqlens, case.paged.page_size)
    for b, n in enumerate(case.paged.cache_seqlens):
        own = indices[indptr[b]:indptr[b + 1]].long()
        keys = x.k[own].reshape(-1, *x.k.shape[2:])  # [pages * page_size, hk, d]
        assert (len(own) - 1) * case.paged.page_size + int(last[b]) == n
        assert torch.equal(keys[:n], x.k_logical[b, :n])


@pytest.mark.parametrize("window,causal,want", [((-1, -1), False, -1), ((7, -1), False, 7), ((7, 3), True, 7),
                                                ((0, -1), True, 0)])
def test_flashinfer_window_left(window, causal, want):
    assert flashinfer_window(window, causal) == want


def test_a_right_bound_without_causal_is_unsupported_by_flashinfer():
    with pytest.raises(Unsupported) as e:
        flashinfer_window((4, 2), causal=False)
    assert "right bound (2) without causal" in str(e.value)


def test_flash_attn_4_window_says_none_for_no_bound():
    assert flash_attn_4_window((-1, -1)) == (None, None) and flash_attn_4_window((128, 0)) == (128, 0)
