"""The draw of a ragged batch (what strategies.cases asks for when a subject declares varlen or paged): the
sequences' lengths, a varlen tail, and a paged cache's lengths, page size, page order and pool."""
from __future__ import annotations

import hypothesis.strategies as st

from faverify.cases.case import Case
from faverify.cases.vocabulary import PAGE_ORDERS

# A sequence of a varlen batch: one token (what shrinking goes to), none, and the tile edges
SEQUENCE_LENGTHS = (1, 0, 2, 17, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1023, 1024, 1025)
TAILS = (0, 1, 7, 64)  # unused tokens past a varlen batch's last offset
EMPTY_SIDES = ("none", "keys", "keys", "queries", "queries")
EMPTY_CACHE = (False, False, True)  # a paged batch's cache made empty, one in three
# Page sizes: 1 first (shrinking goes there), the common 16 and 64, and non-powers of two
PAGE_SIZES = (1, 16, 64, 3, 7, 13, 256)
LONG_CACHE_ODDS = 16  # one paged case in this many has a cache past max_seqlen (up to Limits.max_cache)
HUGE_POOL_ODDS = 32  # one paged case in this many has a pool past 2^32 elements, where Limits allow it
INT32_ELEMENTS = 1 << 31  # offsets into a pool this large overflow a signed 32-bit product


def _lengths(cap: int) -> st.SearchStrategy[int]:
    """One sequence's length: tile edges most of the time (0, a zero-length sequence, among them), any
    length up to cap otherwise; shrinks to 1."""
    edges = [n for n in SEQUENCE_LENGTHS if n <= cap] or [1]
    return st.one_of(st.sampled_from(edges), st.integers(0, cap))


@st.composite
def ragged(draw, kinds: tuple, dense: dict, limits, cap: int, ragged_only: bool = False,
           speculative: bool = False, dense_weight: int = 1, fit=None) -> dict:
    """The fields of a varlen or a paged batch (or none: dense, what it shrinks to). Varlen: 1 to
    2 * max_batch sequences, each (seqlen_q, seqlen_k) from _lengths, one of them maybe as long as a dense
    case may be, and a tail. Paged: a decode step (1..16 queries) or the dense draw's seqlen_q against
    caches of _lengths, now and then one past max_seqlen, in pages of PAGE_SIZES laid out per PAGE_ORDERS.
    fit(seqlen_q, seqlen_k, cap): each sequence's lengths as the subject takes them (strategies.Lengths)."""
    kind = draw(st.sampled_from(kinds if ragged_only else ("dense",) * dense_weight + kinds))
    if kind == "dense":
        return {}
    most = max(2, 2 * limits.max_batch)
    n = draw(st.one_of(st.just(1), st.integers(1, most), st.integers(min(3, most), most)))  # one, or three or more
    each = max(1, cap // n)
    heads, d = dense["nheads_k"], dense["head_dim"]
    if kind == "varlen":
        pairs = [[draw(_lengths(each)), draw(_lengths(each))] for _ in range(n)]
        if draw(st.booleans()):  # one long sequence among short ones
            pairs[draw(st.integers(0, n - 1))] = [draw(st.integers(each, cap)), draw(st.integers(each, cap))]
        empty = draw(st.sampled_from(EMPTY_SIDES))  # a sequence with no key or no query (shrinks to neither)
        if empty == "queries" and n == 1:  # one more sequence, whose queries are none
            pairs.append([0, draw(_lengths(each))])
        elif empty != "none":
            pairs[draw(st.integers(0, n - 1))][1 if empty == "keys" else 0] = 0
        if max(p[0] for p in pairs) == 0:
            pairs[0][0] = 1  # at least one query row
        if fit is not None:
            pairs = [list(fit(sq, sk, cap)) for sq, sk in pairs]
        return dict(batch=len(pairs), seqlen_q=max(p[0] for p in pairs), seqlen_k=max(p[1] for p in pairs),
                    seqlens=tuple(map(tuple, pairs)), tail=draw(st.sampled_from(TAILS)), layout="contiguous")
    seqlen_q = draw(st.integers(2, 16) if speculative else
                    st.one_of(st.just(1), st.integers(1, 16), st.just(dense["seqlen_q"])))
    # the values are drawn as a padded [n, longest, hk, d] batch: 32 dense cases' worth at most
    longest = max(min(limits.max_cache, 32 * limits.max_elements // (n * heads * d)), limits.max_seqlen)
    caches = [draw(_lengths(each)) for _ in range(n)]
    if draw(st.sampled_from(EMPTY_CACHE)) and n > 1:  # an empty cache among the others (shrinks to none)
        caches[draw(st.integers(0, n - 1))] = 0
    if longest > each and draw(st.sampled_from(range(LONG_CACHE_ODDS))) == LONG_CACHE_ODDS - 1:
        caches[draw(st.integers(0, n - 1))] = draw(st.integers(each, longest))
    # one token a page four times as often, pages of no power of two twice as often
    page_size = draw(st.sampled_from(PAGE_SIZES[:1] * 3 + PAGE_SIZES + tuple(n for n in PAGE_SIZES if n & (n - 1))))
    pages = draw(st.sampled_from(PAGE_ORDERS + PAGE_ORDERS[1:]))  # out of order twice as often
    if fit is not None:  # a long cache may pass cap: rounded down there
        seqlen_q = fit(seqlen_q, seqlen_q, cap)[0]
        caches = [fit(seqlen_q, c, max(cap, c))[1] for c in caches]
    shape = dict(batch=n, seqlen_q=seqlen_q, seqlen_k=max(caches), cache_seqlens=tuple(caches), page_size=page_size,
                 pages=pages, layout="contiguous")
    page_elements = page_size * heads * d
    huge = -(-2 * INT32_ELEMENTS // page_elements)  # half the pool past the 32-bit offsets
    if (huge * page_elements <= limits.max_pool_elements
            and draw(st.sampled_from(range(HUGE_POOL_ODDS))) == HUGE_POOL_ODDS - 1):
        used = Case.of(**{**dense, **shape}).pages_used
        shape.update(pool=max(huge, used + 1), pages="random")
    return shape
