"""What a subject is: a callable with the faverify signature and a statement of what it supports.

The call signature (docs/design.md): fn(q, k, v, *, causal, softmax_scale[, init][, window_size][, softcap]
[, alibi_slopes][, sinks]) on [b, s, h, d] tensors, returning out or (out, lse); softmax_scale is None when
the case uses the default, head_dim ** -0.5; a variant's keyword (flash-attn's name) is passed only when
the case uses it, and only to a subject that declares the feature. Its backward is whatever torch
autograd gives through it (dsinks too, when sinks require grad).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import torch

from faverify.cases import conventions as _conventions
from faverify.cases.case import Case
from faverify.cases.inputs import EXTRAS
from faverify.cases.vocabulary import DTYPES, FEATURES, FP8_DRAWN, INITS, MAX_HEAD_DIM_V, MLA_HEAD_DIM

INPUTS = ("q", "k", "v", "dout")  # what a subject is given: dout through autograd
# the relations between calls a subject may promise (run/relations.py)
RELATIONS = ("batch", "decode", "repeat", "splits")
from faverify.errors import Unsupported
from faverify.subjects.groups import (
    GROUPS,
    FP8Caps,
    MaskCaps,
    RaggedCaps,
    check_flags,
    check_integers,
    check_names,
    check_positive,
    flattened,
    split_flat,
)
from faverify.subjects.keywords import KEYWORDS, missing_keywords, takes_init, variant_keywords


@dataclass(frozen=True)
class Capabilities:
    dtypes: tuple = DTYPES
    devices: tuple = ("cpu", "cuda")
    min_head_dim: int = 1
    max_head_dim: int = 256
    # q/k's and v's head dims must be multiples of this (flash-attn-4: 8, 16 bytes of a 16-bit element); a
    # fuzz of the subject draws its head dims rounded up to one, so no case is drawn only to be skipped
    head_dim_multiple: int = 1
    # the only head dims it takes, q/k's and v's alike (FlashInfer's kernels are compiled for 64, 128 and
    # 256); empty: any in min_head_dim..max_head_dim. A fuzz of the subject draws from them alone
    head_dims: tuple = ()
    # the sequence lengths it takes: each a multiple of seqlen_multiple (a kernel without tail tiles), and
    # with equal_seqlens, q's and k's of one length (Triton's tutorial flash attention); a fuzz of the subject
    # draws only such lengths, each sequence of a ragged batch too
    seqlen_multiple: int = 1
    equal_seqlens: bool = False
    gqa: bool = True
    init_modes: tuple | None = None  # None: the subject takes no init; cases run whatever their init
    backward: bool = True
    # the devices its backward runs on, where it has one (FlexAttention compiled on the CPU has none): a case
    # there is judged on its forward, and says so; elsewhere an out without an autograd graph fails it
    backward_devices: tuple = ("cpu", "cuda")
    lse: bool = False  # returns (out, lse)
    # inputs the subject may write (a kernel that appends to a KV cache it is given); any other input it
    # changes is a failing case ("modified q in place"), judged against references from the untouched copy
    writes: tuple = ()
    # variant features (vocabulary.FEATURES): a case using one the subject does not declare is skipped
    window: bool = False
    softcap: bool = False
    alibi: bool = False
    sinks: bool = False
    head_dim_v: bool = False
    ragged: RaggedCaps = RaggedCaps()  # varlen, paged and split-KV batches (groups.RaggedCaps)
    # takes out=, a buffer to write into (varlen: [total_q + tail, h, dv]); it must not write past the
    # last sequence's tokens
    out_buffer: bool = False
    masks: MaskCaps = MaskCaps()  # masks and biases (groups.MaskCaps)
    # where causal aligns, lse's base, the lse of a row that sees no key, ALiBi's form: a preset's name
    # (conventions.PRESETS: "flash-attn-2", "flashinfer", ...) or a dict of conventions.Conventions' fields
    conventions: object = _conventions.DEFAULT
    # relations between calls the subject promises (run/relations.py), value for value: "batch", each batch
    # entry computed alone gives its row of the batched call; "decode", the last query row computed alone
    # gives that row; "repeat", the same call twice gives the same values; "splits", a split-KV call gives the
    # values of the call with one split. A broken promise fails the case (relation:batch, ...)
    relations: tuple = ()
    # a loss on lse: the lse it returns carries an autograd graph, whose gradient is judged with the others'
    lse_grad: bool = False
    # returns the largest logit each row sees when a case asks (return_max_logit=True), last in what it
    # returns; one per row or one per head (conventions.max_logit)
    max_logit: bool = False
    # sparse key indices: takes `indices`, int32 [b, seqlen_q, nheads_k, topk] (cases/sparse.py); how it
    # weighs a key listed twice is its conventions.sparse_duplicates
    sparse: bool = False
    # takes v as the leading head_dim_v columns of k's storage (v = k[..., :dv]); with max_head_dim 576 its
    # cases also draw MLA's head dims (576 for q/k beside 512 for v) and K = V at 512
    kv_shared: bool = False
    fp8: FP8Caps = FP8Caps()  # FP8 inputs (groups.FP8Caps)
    # its tile, (query rows, keys), where it has one: `repro --plot` marks the tile edges; empty: none declared
    tile: tuple = ()

    def __post_init__(self) -> None:
        """Each field of the type it must have: a declaration that is not valid is refused when the subject
        loads, not as a failure of every case."""
        object.__setattr__(self, "conventions", _conventions.parse(self.conventions))
        allowed = {"dtypes": DTYPES, "devices": ("cpu", "cuda"), "backward_devices": ("cpu", "cuda"),
                   "writes": INPUTS + EXTRAS, "relations": RELATIONS}
        if self.init_modes is not None:
            allowed["init_modes"] = INITS
        for name, names in allowed.items():
            check_names(self, name, names)
        check_integers(self, "tile", lambda n: n >= 1, "[query rows, keys], two integers >= 1", count=(0, 2))
        if self.lse_grad and not self.lse:
            raise ValueError("lse_grad needs lse: true (a loss on lse needs the subject to return lse)")
        for name in ("min_head_dim", "max_head_dim", "head_dim_multiple", "seqlen_multiple"):
            check_positive(self, name)
        if self.min_head_dim > self.max_head_dim:
            raise ValueError(f"min_head_dim {self.min_head_dim} is above max_head_dim {self.max_head_dim}")
        check_integers(self, "head_dims", lambda d: self.min_head_dim <= d <= self.max_head_dim,
                       f"a list of integers in min_head_dim..max_head_dim ({self.min_head_dim}..{self.max_head_dim})")
        check_flags(self, "gqa", "backward", "lse", "out_buffer", "equal_seqlens", "window", "softcap", "alibi",
                    "sinks", "head_dim_v", "lse_grad", "max_logit", "sparse", "kv_shared")
        # each feature's declaration, by its name in vocabulary.FEATURES: "fp8" where it takes any descales
        flat = {**flattened(self.ragged), **flattened(self.masks), "fp8": bool(self.fp8.granularities)}
        object.__setattr__(self, "_declared", {f: bool(flat[f] if f in flat else getattr(self, f)) for f in FEATURES})

    @classmethod
    def of(cls, **fields) -> "Capabilities":
        """Capabilities from a flat declaration (faverify_capabilities' keys: varlen, mask, fp8, ...), each
        group made from its FLAT names. An unknown key is a TypeError, as a dataclass's own keyword is."""
        known = {f.name for f in dataclasses.fields(cls)} - set(GROUPS) | {n for g in GROUPS.values() for n in g.FLAT}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise TypeError(f"unknown key {unknown[0]!r} (the keys: {', '.join(sorted(known))})")
        return cls(**split_flat(fields))

    def declares(self, feature: str) -> bool:
        """Whether it declares the feature (a name of vocabulary.FEATURES)."""
        return self._declared[feature]

    def reason_unsupported(self, case: Case, device: torch.device) -> str | None:
        if case.dtype not in self.dtypes:
            return f"dtype {case.dtype} not supported (supports {', '.join(self.dtypes)})"
        if device.type not in self.devices:
            return f"device {device.type} not supported (supports {', '.join(self.devices)})"
        if not self.min_head_dim <= case.head_dim <= self.max_head_dim:
            return f"head_dim {case.head_dim} outside {self.min_head_dim}..{self.max_head_dim}"
        if self.head_dims and not {case.head_dim, case.dv} <= set(self.head_dims):
            return (f"head dims q/k {case.head_dim}, v {case.dv}: takes only "
                    f"{', '.join(map(str, self.head_dims))}")
        if not self.gqa and case.nheads_k != case.nheads:
            return "GQA/MQA (nheads_k != nheads) not supported"
        if self.init_modes is not None and case.init not in self.init_modes:
            return f"init {case.init} not supported"
        missing = [f for f in case.features() if not (self.mask_form(case) if f == "mask" else self.declares(f))]
        if missing:
            return f"{', '.join(missing)} not declared by the subject (faverify_capabilities)"
        if case.dv != case.head_dim and not self.min_head_dim <= case.dv <= self.max_head_dim:
            return f"head_dim_v {case.dv} outside {self.min_head_dim}..{self.max_head_dim}"
        if case.head_dim % self.head_dim_multiple or case.dv % self.head_dim_multiple:
            return (f"head dims must be multiples of {self.head_dim_multiple} (q/k {case.head_dim}, "
                    f"v {case.dv})")
        lengths = self.lengths_refused(case)
        if lengths:
            return lengths
        sizes = self.ragged.page_sizes
        if sizes is not None and case.paged is not None and case.paged.page_size not in sizes:
            return f"page size {case.paged.page_size} not supported (supports {', '.join(map(str, sizes))})"
        if not self.ragged.dense and case.kind == "dense":
            return "dense cases not supported (the subject declares dense: false, varlen or paged only)"
        if self.ragged.combine and case.splits < 2:
            return "a split-KV combine is judged on split cases only (splits >= 2)"
        fp8 = self.fp8
        if fp8.granularities and case.fp8 is not None and case.fp8.granularity not in fp8.granularities:
            return f"FP8 descales per {case.fp8.granularity} not taken (takes: per {', '.join(fp8.granularities)})"
        if case.fp8 is not None and case.fp8.format not in fp8.formats:
            return f"FP8 format {case.fp8.format} not taken (takes: {', '.join(fp8.formats)})"
        if fp8.only and case.fp8 is None:
            return "takes FP8 inputs alone (fp8_only)"
        return None

    def backward_on(self, device_type: str) -> bool:
        """Whether its backward runs on this device type."""
        return self.backward and device_type in self.backward_devices

    def lengths_refused(self, case: Case) -> str | None:
        """Why the case's sequence lengths are not ones it takes (seqlen_multiple, equal_seqlens), or None."""
        for sq, sk in case.sequences:
            if self.equal_seqlens and sq != sk:
                return f"seqlen_q {sq} != seqlen_k {sk}: takes q and k of one length (equal_seqlens)"
            if sq % self.seqlen_multiple or sk % self.seqlen_multiple:
                return f"seqlens must be multiples of {self.seqlen_multiple} (q {sq}, k {sk})"
        return None

    def mask_form(self, case: Case) -> str | None:
        """How this subject takes the case's mask: "attn_mask" (a bool tensor), "mask_mod" (a function),
        "block_mask" (a block pattern's blocks), or None when it cannot."""
        # the form that lets a kernel skip the empty blocks
        if self.masks.block_mask and case.mask is not None and case.mask.pattern == "block":
            return "block_mask"
        if self.masks.mask:
            return "attn_mask"
        if self.masks.mask_mod:
            return "mask_mod"
        return None

    def features(self) -> tuple:
        """The features its cases may draw ("mask": in any form it takes)."""
        return tuple(f for f in FEATURES if self.declares(f) or (f == "mask" and self.masks.any_mask()))

    def draw(self) -> dict:
        """strategies.cases' arguments that every case of this subject needs: split cases for a combine,
        ragged ones for a subject that takes no dense batch, block patterns for one that takes masks as
        blocks only, its head dims where it lists them, v's no larger than it takes, the lengths it takes."""
        ragged, masks, fp8 = self.ragged, self.masks, self.fp8
        return {**({"always_split": True} if ragged.combine else {}),
                **({"max_head_dim_v": self.max_head_dim}
                   if self.head_dim_v and self.max_head_dim < MAX_HEAD_DIM_V else {}),
                **({"head_dim_multiple": self.head_dim_multiple} if self.head_dim_multiple > 1 else {}),
                **({"seqlen_multiple": self.seqlen_multiple} if self.seqlen_multiple > 1 else {}),
                **({"equal_seqlens": True} if self.equal_seqlens else {}),
                **({"head_dims": self.head_dims, "exact_head_dims": True} if self.head_dims else {}),
                **({"ragged_only": True} if not ragged.dense and (ragged.varlen or ragged.paged) else {}),
                **({"masks": ("block",)} if masks.block_mask and not (masks.mask or masks.mask_mod) else {}),
                **({"mla": True} if self.kv_shared and self.max_head_dim >= MLA_HEAD_DIM else {}),
                **({"fp8_formats": fp8.formats} if fp8.granularities and len(fp8.formats) > 1 else {}),
                **({"fp8_scales": fp8.granularities} if fp8.granularities and fp8.granularities != FP8_DRAWN else {}),
                **({"fp8_only": True} if fp8.only else {})}

    def to_dict(self) -> dict:
        """The flat declaration, each group's fields by their FLAT names in the group's place."""
        d = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            d.update(flattened(value) if f.name in GROUPS else {f.name: value})
        d["conventions"] = self.conventions.to_dict()
        return d


@dataclass(frozen=True)
class Since:
    """What a subject's calls did since the last Subject.take: the code paths its kernels took, the compiles
    they made, and the seconds they spent compiling by phase ("compile", "load")."""
    paths: tuple = ()
    compiles: int = 0
    compile_seconds: dict = field(default_factory=dict)


@dataclass
class Subject:
    name: str
    fn: Callable
    caps: Capabilities
    description: str = ""
    # warmup(dtypes, features): cases that together make the subject compile every variant it can run for
    # the given dtypes and drawn features (a JIT compiles per set of compile-time constants; a feature the
    # fuzz does not draw needs no build). A parallel fuzz runs them first, spread over its workers, so each
    # variant compiles once and lands in the on-disk cache before the cases start, instead of every worker
    # compiling every variant itself. None: nothing to compile ahead.
    warmup: Callable[[tuple, tuple], list] | None = None
    # The code paths its kernels took since the last call, which starts a new list (e.g. ["fwd hopper",
    # "bwd triton"]): each case reports them, a fuzz counts the cases per path. None: not told.
    paths: Callable[[], list] | None = None
    # Seconds its calls since the last one spent compiling (a JIT that compiles on first use): each case
    # reports them as its "compile" phase, apart from the kernel's; or a dict of such phases (the Triton
    # kernels: {"compile": ..., "load": ...}, a build compiled or loaded from the JIT's cache). None: not told.
    compile_seconds: Callable[[], float | dict] | None = None
    # The compiles its calls made since the last call (a JIT that compiles per configuration), and the
    # configurations a case's calls need, as hashable keys (case, device type): a fuzz of a subject that
    # declares them draws within a shape budget unless told otherwise, and counts both. None: not told.
    compiles: Callable[[], int] | None = None
    compile_key: Callable[[Case, str], tuple] | None = None
    # The source of `call(q, k, v, causal, softmax_scale)` -> out or (out, lse), with its imports, in plain
    # torch and the subject's library alone: `faverify repro --standalone` writes it into a script that runs
    # without faverify (commands/standalone.py). "": the subject has none.
    standalone: str = ""

    def take(self) -> "Since":
        """What its calls did since the last take (paths, compiles, compile_seconds), each hook emptied."""
        spent = self.compile_seconds() if self.compile_seconds is not None else {}
        return Since(paths=tuple(self.paths()) if self.paths is not None else (),
                     compiles=self.compiles() if self.compiles is not None else 0,
                     compile_seconds=spent if isinstance(spent, dict) else {"compile": spent} if spent else {})

    def unsupported(self, case: Case, device: torch.device) -> str | None:
        return self.caps.reason_unsupported(case, device)

    def __call__(self, q, k, v, case: Case, extras: dict | None = None):
        """(out, lse or None) of call()."""
        return self.call(q, k, v, case, extras)[:2]

    def call(self, q, k, v, case: Case, extras: dict | None = None, out=None):
        """Run the subject on one case: (out, lse or None, (out_splits, lse_splits) or None, max_logit or
        None). A case that asks for the max logit passes return_max_logit=True, and takes it from the end of
        what the subject returns.
        Unsupported -> faverify.errors.Unsupported. extras: the case's variant and ragged tensors by
        keyword (Inputs.extras); out: the buffer a subject that declares out_buffer writes into.

        A case with the default scale passes softmax_scale=None: the subject's own default (which must be
        head_dim ** -0.5) is under test too, and is where a 1/d-instead-of-1/sqrt(d) bug lives."""
        kwargs = {"causal": case.causal, "softmax_scale": case.softmax_scale}
        if self.caps.init_modes is not None:
            kwargs["init"] = case.init
        kwargs.update(variant_keywords(case, extras or {}, self.caps))
        if out is not None:
            kwargs["out"] = out
        if self.caps.ragged.splits:  # even 1: a split subject's own default might cut the keys otherwise
            kwargs["num_splits"] = case.splits
        if case.max_logit:
            kwargs["return_max_logit"] = True
        result = self.fn(q, k, v, **kwargs)
        max_logit = None
        if case.max_logit:
            if not isinstance(result, (tuple, list)) or len(result) != (3 if self.caps.lse else 2):
                raise TypeError(f"{self.name} was asked for the max logit: it must return "
                                + ("(out, lse, max_logit)" if self.caps.lse else "(out, max_logit)"))
            result, max_logit = (tuple(result[:-1]) if self.caps.lse else result[0]), result[-1]
        return self._parts(result) + (max_logit,)

    def _parts(self, result) -> tuple:
        """(out, lse or None, splits or None) of what the subject's function returned."""
        if self.caps.ragged.splits:
            if not isinstance(result, (tuple, list)) or len(result) != 4:
                raise TypeError(f"{self.name} declares splits: it must return (out, lse, out_splits, lse_splits)")
            return result[0], result[1], (result[2], result[3])
        if isinstance(result, (tuple, list)):
            if len(result) != 2:
                raise TypeError(f"{self.name} returned {len(result)} values; expected out or (out, lse)")
            return result[0], result[1], None
        return result, None, None


def drain(log: list) -> list:
    """What a subject appended to its path log since the last call, the log emptied (an adapter's
    Subject.paths: functools.partial(drain, its log))."""
    taken = list(log)
    log.clear()
    return taken


__all__ = ["Capabilities", "Since", "Subject", "Unsupported", "INITS", "KEYWORDS", "drain", "missing_keywords",
           "takes_init"]
