"""Large cases (`fuzz --scale large`): shapes whose flattened offsets cross 2^31 - 1, where a kernel that
computes an offset in signed 32-bit arithmetic wraps (docs/design.md, "Offsets past 2^31").

Each case puts a boundary, a multiple of BOUNDARY elements, inside real data: the element before it and the
one at it are drawn values. Its target says which offsets cross:

- "q": q, dO, out and dq hold more than BOUNDARY elements (batch x seqlen_q x nheads x head_dim);
- "kv": k, v, dk and dv do (batch x seqlen_k x nheads_k x head_dim);
- "accumulator": the inputs stay below it, but a dq accumulator that pads each sequence to
  ACCUMULATOR_ROWS query rows passes it (flash-attention's dq_accum at batch 8300 x seqlen 1 x 16 heads x
  d128);
- "pool": a paged cache whose page ids times the page's elements pass it; the pages in use sit on both sides
  of the boundary ("reverse" order in a pool sized so), full of keys.

The large dimension of a dense case is its batch, and each batch entry is its own problem: the judge reads
back the entries around each boundary (judged_entries) and computes the FP64 reference on them alone. A
paged case's queries are few: its reference is computed whole, sequence by sequence, as any paged case's.
"""
from __future__ import annotations

import random

from hypothesis import strategies as st

from faverify.cases.case import Case
from faverify.cases.ragged_draws import PAGE_SIZES
from faverify.cases.strategies import CPU_LIMITS, GROUPS, SEQLENS, Limits, aligned, seqlens
from faverify.cases.vocabulary import MAX_HEAD_DIM
from faverify.errors import UsageError

BOUNDARY = 1 << 31  # elements: the first offset a signed 32-bit integer does not hold
TARGETS = ("q", "kv", "accumulator", "pool")
ACCUMULATOR_ROWS = 128  # flash-attention pads each sequence of its fp32 dq accumulator to this many rows
ACCUMULATOR_SEQLENS = (1, 2, 17, 33, 64)  # at most half a padded block: the inputs stay below the boundary
HEAD_DIMS = (64, 128)  # the head dims the large cases take, within what the subject takes
# values of one size: every element moves the outputs, where the other regimes put most rows on one key
# (whose dq is then near 0, and a dq added in the wrong place passes)
REGIMES = ("normal",)
LAYOUTS = ("contiguous", "transposed")  # every element of the store is the tensor's: no gap, no broadcast
ENTRY_SEQLEN = 4096  # the longest sequence of the large side: one batch entry's FP64 reference stays small
SHORT_SEQLEN = 256  # the keys of a "q" or an "accumulator" case at most
DECODE_ROWS = 16  # the queries of a "kv" or a "pool" case at most
MIN_BEFORE = 4  # batch entries before the first boundary at least, where the head dims allow
OTHER_ENTRIES = 2  # entries judged away from the boundaries, drawn from the case's seed
MAX_SEQUENCES, MAX_PAGES = 4, 4  # a pool case's sequences, and pages a sequence


def spaces(case: Case) -> tuple:
    """(tensor, elements of one batch entry) of each offset space of a dense case a kernel indexes by batch
    entry: q and dq, out and dO, k and dk, v and dv, and a dq accumulator padded to ACCUMULATOR_ROWS rows."""
    padded = -(-case.seqlen_q // ACCUMULATOR_ROWS) * ACCUMULATOR_ROWS
    return (("q", case.seqlen_q * case.nheads * case.head_dim), ("out", case.seqlen_q * case.nheads * case.dv),
            ("k", case.seqlen_k * case.nheads_k * case.head_dim), ("v", case.seqlen_k * case.nheads_k * case.dv),
            ("dq accumulator", padded * case.nheads * case.head_dim))


def judged_entries(case: Case, boundary: int = BOUNDARY) -> tuple | None:
    """The batch entries a judge reads back of a dense case whose offsets cross `boundary` in some space
    (spaces): at each multiple of it, the entry that holds the element before it, the one that holds it,
    and the next; the first entry and the last; and OTHER_ENTRIES more drawn from the case's seed (a wrapped
    write lands in an earlier entry). None where no offset crosses, or the case is ragged or has a variant
    feature: such a case is judged whole."""
    if case.kind != "dense" or case.features():
        return None
    entries: set = set()
    for _, per in spaces(case):
        for past in range(boundary, case.batch * per, boundary) if per else ():
            entries.update(e for e in ((past - 1) // per, past // per, past // per + 1) if e < case.batch)
    if not entries:
        return None
    others = random.Random(case.seed).sample(range(case.batch), min(OTHER_ENTRIES, case.batch))
    return tuple(sorted(entries | {0, case.batch - 1, *others}))


def cases(*, dtypes: tuple = ("bf16", "fp16"), limits: Limits = CPU_LIMITS, features: tuple = (),
          ragged_only: bool = False, head_dims: tuple = HEAD_DIMS, exact_head_dims: bool = False,
          head_dim_multiple: int = 1, regimes: tuple = REGIMES, layouts: tuple = LAYOUTS,
          boundary: int = BOUNDARY, **_normal_only) -> st.SearchStrategy[Case]:
    """Large cases of a subject, with the arguments strategies.cases takes (what narrows the ordinary
    draw's variants, masks, FP8 inputs or shapes has no large case and is left out): the dense targets
    unless ragged_only, "pool" where features has "paged"; heads up to limits.max_heads; the head dims of
    HEAD_DIMS the subject takes (exact_head_dims: its own list); the regimes and layouts of REGIMES and
    LAYOUTS among those given. boundary: BOUNDARY, or a small analogue (a test's 2^12) that draws the
    same shapes at its scale."""
    targets = (() if ragged_only else TARGETS[:3]) + (("pool",) if "paged" in features else ())
    if not targets:
        raise UsageError("--scale", "large", "draws dense batches and paged caches: the subject takes neither")
    for option, given, own in (("--regimes", regimes, REGIMES), ("--layouts", layouts, LAYOUTS)):
        if not set(given) & set(own):
            raise UsageError(option, ",".join(given), f"--scale large draws {', '.join(own)} alone")
    regimes, layouts = (tuple(r for r in REGIMES if r in regimes), tuple(la for la in LAYOUTS if la in layouts))
    dims = tuple(head_dims) if exact_head_dims else (
        tuple(d for d in HEAD_DIMS if min(head_dims) <= d <= max(head_dims)) or (max(head_dims),))
    dims = tuple(dict.fromkeys(aligned(d, head_dim_multiple, MAX_HEAD_DIM) for d in dims))
    return _large(targets, tuple(dtypes), max(1, limits.max_heads), dims, regimes, layouts, boundary)


@st.composite
def _large(draw, targets: tuple, dtypes: tuple, max_heads: int, dims: tuple, regimes: tuple, layouts: tuple,
           boundary: int) -> Case:
    target = draw(st.sampled_from(targets))
    head_dim = draw(st.sampled_from(dims))
    nheads_k = draw(st.integers(1, min(4, max_heads)))
    group = draw(st.sampled_from(GROUPS))
    while group > 1 and group * nheads_k > max_heads:
        group //= 2
    common = dict(head_dim=head_dim, dtype=draw(st.sampled_from(dtypes)), causal=draw(st.booleans()),
                  regime=draw(st.sampled_from(regimes)), seed=draw(st.integers(0, 2**31 - 1)))
    if target == "pool":
        return Case.of(**common, **draw(_pool(nheads_k, group, head_dim, boundary)))
    # the heads one entry of the large space holds, cut so that MIN_BEFORE entries fit before the boundary
    block = {"q": head_dim, "kv": head_dim, "accumulator": ACCUMULATOR_ROWS * head_dim}[target]
    heads = max(1, boundary // (MIN_BEFORE * block))
    nheads_k, group = _fit(nheads_k, group, heads, share_group=target != "kv")
    nheads = nheads_k * group
    wide = nheads if target != "kv" else nheads_k
    cap = max(1, min(ENTRY_SEQLEN, boundary // (MIN_BEFORE * wide * head_dim)))
    # two keys at least: against one key a row's out is that key's value and its dq 0, whatever q holds
    keys = seqlens(max_seqlen=SHORT_SEQLEN).map(lambda n: max(2, n))
    if target == "q":
        seqlen_q, seqlen_k = draw(_long(cap)), draw(keys)
    elif target == "kv":
        seqlen_k = draw(_long(cap))
        seqlen_q = draw(st.integers(1, max(1, min(DECODE_ROWS, seqlen_k // (2 * group)))))
    else:
        seqlen_q, seqlen_k = draw(st.sampled_from(ACCUMULATOR_SEQLENS)), draw(keys)
    per = {"q": seqlen_q, "kv": seqlen_k, "accumulator": ACCUMULATOR_ROWS}[target] * wide * head_dim
    before = boundary // per  # entries wholly before the first boundary
    batch = before + draw(st.one_of(st.integers(1, 3), st.integers(1, max(1, before // 64))))
    if target == "accumulator":  # the inputs below the boundary: only the padded accumulator crosses it
        batch = max(before + 1, min(batch, (boundary - 1) // (seqlen_q * nheads * head_dim)))
    return Case(batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, nheads=nheads, nheads_k=nheads_k,
                layout=draw(st.sampled_from(layouts)), **common)


def _fit(nheads_k: int, group: int, most: int, share_group: bool) -> tuple:
    """(nheads_k, group) halved, the group first, until the heads one batch entry of the large space holds
    (all of them; the kv heads alone where share_group is False) are at most `most`."""
    while (nheads_k * group if share_group else nheads_k) > most:
        if share_group and group > 1:
            group //= 2
        elif nheads_k > 1:
            nheads_k //= 2
        else:
            break
    return nheads_k, group


def _long(cap: int) -> st.SearchStrategy[int]:
    """The large side's sequence: a quarter of cap to cap, at a tile edge (SEQLENS) half the time."""
    low = max(1, cap // 4)
    edges = [s for s in SEQLENS if low <= s <= cap] or [cap]
    return st.one_of(st.sampled_from(edges), st.integers(low, cap))


@st.composite
def _pool(draw, nheads_k: int, group: int, head_dim: int, boundary: int) -> dict:
    """A paged batch whose pages straddle a multiple of the boundary (twice it one time in three: an
    unsigned 32-bit offset wraps there): pages in "reverse" order from the top of a pool of
    first + j pages, j in 1..used - 1, where page `first` is the first to start at or past the boundary.
    Every page full, so the last element before it and the first past it are keys."""
    fits = [p for p in PAGE_SIZES if p * nheads_k * head_dim * (MAX_SEQUENCES * MAX_PAGES + 2) <= boundary] or [1]
    page_size = draw(st.sampled_from(fits))
    pages = [draw(st.integers(1, MAX_PAGES)) for _ in range(draw(st.integers(1, MAX_SEQUENCES)))]
    if sum(pages) < 2:  # a page on each side of the boundary
        pages[0] = 2
    past = draw(st.sampled_from((1, 1, 2))) * boundary
    first = -(-past // (page_size * nheads_k * head_dim))
    caches = tuple(p * page_size for p in pages)
    return dict(batch=len(pages), seqlen_q=draw(st.integers(1, DECODE_ROWS)), seqlen_k=max(caches),
                nheads=nheads_k * group, nheads_k=nheads_k, cache_seqlens=caches, page_size=page_size,
                pages="reverse", pool=first + draw(st.integers(1, sum(pages) - 1)), layout="contiguous")
