"""Golden files: stored cases, their inputs (bit-exact) and their FP64 outputs and gradients; the file
format: reading, checking and writing the files. Computing what they hold (record) and verifying a
subject against them (verify) are the golden command's (commands/golden.py).

Files are NumPy .npz read with allow_pickle=False (no unpickling); bf16/fp16 inputs are stored as their
raw 16-bit patterns. index.json holds each case and the sha256 of its file: a missing, truncated or
tampered file is reported by name. The files ship inside the package (golden/, faverify/golden in a wheel), so an
installed faverify finds them wherever it runs.
"""
from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from faverify.cases.case import Case
from faverify.cases.inputs import Inputs
from faverify.cases.vocabulary import TENSORS
from faverify.dtypes import TORCH
from faverify.errors import UsageError
from faverify.files import Unreadable, read_bounded, replace_whole

INDEX_VERSION = 1
# golden/ sits at the top of a clone; a wheel carries it as faverify/golden (pyproject.toml's package-dir)
_HERE = Path(__file__).resolve()
DEFAULT_DIR = next((d for d in (_HERE.parents[1] / "golden", _HERE.parents[2] / "golden") if d.is_dir()),
                   _HERE.parents[1] / "golden")


def _c(b, sq, sk, h, hk, d, dtype="bf16", causal=False, regime="normal", layout="contiguous", init="-inf",
       scale=None, seed=1, **variant):
    return Case(batch=b, seqlen_q=sq, seqlen_k=sk, nheads=h, nheads_k=hk, head_dim=d, dtype=dtype, causal=causal,
                softmax_scale=scale, regime=regime, layout=layout, init=init, seed=seed, **variant)


# Every regime and edge the strategies reach, small enough to verify in seconds on a CPU.
CASES = {
    "one-key": _c(1, 1, 1, 1, 1, 64),
    "seqlen-17-causal": _c(1, 17, 17, 2, 2, 64, "fp16", True),
    "gqa-113x203": _c(1, 113, 203, 4, 2, 16),
    "masked-rows-203x113": _c(1, 203, 113, 2, 1, 24, "fp16", True),
    "masked-rows-1023x17": _c(1, 1023, 17, 1, 1, 16, "bf16", True),
    "masked-rows-init-1e30": _c(1, 130, 65, 2, 1, 64, "bf16", True, init="-1e30"),
    "long-keys-17x1023": _c(1, 17, 1023, 1, 1, 16, "fp16"),
    "block-edges-65x129": _c(1, 65, 129, 2, 2, 40, "fp16"),
    "block-edges-129x65-causal": _c(1, 129, 65, 1, 1, 72, "bf16", True),
    "block-edges-127-init-1e30": _c(1, 127, 127, 1, 1, 40, "fp16", True, init="-1e30"),
    "mqa-128": _c(1, 65, 64, 4, 1, 128, "bf16"),
    "head-dim-160": _c(1, 33, 31, 1, 1, 160, "fp16", True),
    "head-dim-192": _c(1, 31, 40, 1, 1, 192, "bf16"),
    "head-dim-256": _c(1, 17, 33, 1, 1, 256, "bf16", True),
    "head-dim-24-batch-2": _c(2, 50, 70, 2, 1, 24, "fp16", True),
    "large-logits-bf16": _c(1, 64, 96, 2, 2, 64, "bf16", regime="large"),
    "large-logits-fp16-causal": _c(1, 96, 64, 2, 1, 64, "fp16", True, regime="large"),
    "bf16-scale-bf16": _c(1, 32, 48, 2, 2, 32, "bf16", regime="bf16-scale"),
    "bf16-scale-fp16": _c(1, 48, 32, 2, 1, 32, "fp16", True, regime="bf16-scale"),
    "outliers-bf16": _c(1, 113, 113, 1, 1, 64, "bf16", True, regime="outliers"),
    "outliers-fp16": _c(1, 203, 150, 2, 1, 32, "fp16", regime="outliers"),
    "constant-bf16": _c(1, 100, 300, 1, 1, 32, "bf16", regime="constant"),
    "constant-fp16-causal": _c(1, 300, 100, 1, 1, 32, "fp16", True, regime="constant"),
    "peaked-bf16": _c(1, 80, 120, 2, 1, 64, "bf16", True, regime="peaked"),
    "peaked-fp16": _c(1, 120, 80, 1, 1, 48, "fp16", regime="peaked"),
    "tiny-bf16": _c(1, 64, 64, 2, 2, 64, "bf16", regime="tiny"),
    "tiny-fp16": _c(1, 64, 64, 2, 2, 64, "fp16", True, regime="tiny"),
    "transposed": _c(2, 65, 65, 2, 2, 32, "bf16", True, layout="transposed"),
    "strided": _c(1, 70, 90, 2, 1, 48, "fp16", layout="strided"),
    "packed-qkv": _c(1, 96, 96, 4, 2, 32, "bf16", True, layout="packed"),
    "packed-kv": _c(1, 40, 96, 2, 2, 64, "fp16", layout="packed"),
    "scale-tiny": _c(1, 64, 128, 2, 2, 32, "bf16", scale=1e-3),
    "scale-large": _c(1, 128, 64, 1, 1, 64, "fp16", True, scale=2.0),
    "fp32-basic": _c(1, 65, 77, 1, 1, 64, "fp32"),
    "fp32-causal-masked": _c(1, 77, 65, 2, 1, 32, "fp32", True),
    "fp32-large": _c(1, 48, 48, 1, 1, 128, "fp32", regime="large"),
    "seed-2-normal": _c(1, 256, 256, 1, 1, 32, "bf16", True, seed=2),
    "seed-3-fp16": _c(1, 255, 257, 1, 1, 32, "fp16", seed=3),
    "seqlen-2": _c(1, 2, 2, 1, 1, 16, "bf16", True),
    "seqlen-q1-causal": _c(1, 1, 113, 2, 2, 64, "fp16", True),
    # the trackers' dense triggers: rows far below zero, lone keys, stride-0 and spread layouts, tail tiles
    "negative-rows-1e6-bf16": _c(1, 64, 80, 2, 1, 64, "bf16", regime="negative", seed=9),
    "negative-rows-100-fp16-causal": _c(1, 80, 64, 2, 2, 32, "fp16", True, regime="negative", seed=2),
    "lone-key-causal": _c(1, 40, 17, 2, 1, 32, "fp16", True, regime="lone-key"),
    "lone-key-window-0": _c(1, 33, 33, 1, 1, 64, regime="lone-key", window=(0, 0)),
    "broadcast-kv-33": _c(2, 65, 33, 4, 2, 32, "bf16", True, layout="broadcast"),
    "spread": _c(1, 64, 96, 2, 2, 64, "fp16", layout="spread"),
    "one-key-129-rows": _c(1, 129, 1, 2, 1, 64, "bf16"),
    "tail-192-causal": _c(1, 192, 192, 1, 1, 64, "fp16", True),
    # variants, at their edges
    "window-0": _c(1, 40, 40, 2, 2, 32, window=(0, 0)),
    "window-left-masked-rows": _c(1, 90, 40, 2, 1, 32, "fp16", window=(7, 0)),
    "window-wider-than-keys": _c(1, 33, 20, 1, 1, 64, window=(50, 50)),
    "softcap-at-the-cap": _c(1, 64, 64, 2, 2, 64, regime="large", softcap=1.0),
    "softcap-30-causal": _c(1, 65, 65, 2, 1, 64, "fp16", True, softcap=30.0),
    "alibi-head-causal": _c(1, 65, 129, 4, 2, 32, "fp16", True, alibi="head"),
    "alibi-batch-head": _c(2, 40, 60, 2, 2, 32, alibi="batch-head"),
    "sinks-dominant": _c(1, 64, 64, 2, 2, 32, sinks="above"),
    "sinks-masked-rows": _c(1, 100, 40, 2, 1, 32, "fp16", True, sinks="around"),
    "sinks-off-by-one": _c(1, 64, 80, 2, 1, 32, "fp16", True, regime="large", sinks="zero"),
    # a loss on lse: beside out's over masked rows, and alone (dv exactly 0) with a sink
    "lse-grad-masked-rows": _c(1, 80, 48, 2, 2, 32, "fp16", True, lse_grad="with"),
    "lse-grad-alone-sinks": _c(1, 48, 64, 2, 1, 32, sinks="around", lse_grad="alone"),
    "head-dim-v-512-d-64": _c(1, 17, 33, 1, 1, 64, head_dim_v=512),
    "mla-192-128-causal": _c(1, 40, 40, 2, 2, 192, "bf16", True, head_dim_v=128),
    # MLA's absorbed form: q/k 576 beside v 512, v the leading columns of k's storage
    "mla-576-512-shared-kv": _c(1, 9, 23, 2, 1, 576, "fp16", True, head_dim_v=512, kv_shared=True),
    "fp32-every-feature": _c(1, 33, 47, 2, 1, 32, "fp32", window=(9, 3), softcap=5.0, alibi="head",
                             sinks="around", head_dim_v=48),
}
QUICK = ("one-key", "masked-rows-203x113", "gqa-113x203", "bf16-scale-bf16", "outliers-fp16", "packed-qkv",
         "head-dim-256", "fp32-causal-masked", "fp32-every-feature")
_EXTRAS = ("alibi_slopes", "sinks")  # fp32 inputs of variant cases, stored as they are
# record draws q, k, v, dout, slopes and sinks; a case's mask, bias or score_mod would not be stored
assert not any(c.mask is not None or c.bias is not None or c.score_mod != "off" for c in CASES.values()), \
    "golden files store no mask, bias or score_mod"


class GoldenFileProblem(Exception):
    """A golden file is missing, truncated or tampered with; the message names it."""


@dataclass
class Entry:
    name: str
    case: Case
    file: str
    sha256: str


def _bits(t: torch.Tensor) -> np.ndarray:
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.contiguous().view(torch.int16).numpy()
    return t.contiguous().numpy()


def _unbits(a: np.ndarray, dtype: str, device) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a))
    if dtype in ("bf16", "fp16"):
        t = t.view(TORCH[dtype])
    return t.to(device)


def write_case(directory: Path, name: str, case: Case, values: Inputs, ref: dict, scales: dict) -> dict:
    """Write one case's file (inputs bit-exact, FP64 outputs and scales); its index entry."""
    arrays = {f"in_{n}": _bits(t) for n, t in zip(("q", "k", "v", "dout"), (values.q, values.k, values.v, values.dout))}
    arrays.update({f"in_{n}": t.numpy() for n, t in values.extras().items()})
    arrays.update({f"ref_{n}": t.numpy() for n, t in ref.items()})
    arrays.update({f"scale_{n}": np.asarray(float(v)) for n, v in scales.items()})
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    data = buffer.getvalue()
    rel = f"cases/{name}.npz"
    _write_new(directory, rel, data)
    return {"name": name, "case": case.to_dict(), "file": rel, "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data)}


def kept_entries(directory: Path, names) -> list:
    """The entries of the index in `directory` that a record of `names` keeps (all but those). An index that
    is there but cannot be read is refused (GoldenFileProblem), never replaced by one that holds only
    `names`; a link planted at its name is not read, and the record replaces it."""
    path = Path(directory) / "index.json"
    if not names or not path.exists() or path.is_symlink():
        return []
    return [e for e in _index_data(path)["cases"] if e["name"] not in names]


def write_index(directory: Path, entries: list, kept: list = ()) -> None:
    """The index of `entries` and `kept` (kept_entries), in CASES' order."""
    order = {name: i for i, name in enumerate(CASES)}
    index_entries = sorted(list(kept) + entries, key=lambda e: order.get(e["name"], len(order)))
    _write_new(directory, "index.json", (json.dumps({"schema": "faverify.golden", "version": INDEX_VERSION,
                                                     "cases": index_entries}, indent=1) + "\n").encode())


def inside(directory: Path, rel: str) -> Path:
    """directory / rel, refused unless it is a relative path that stays inside the directory (no "..", no
    absolute path, no link out of it): a golden index is read from wherever the user points faverify."""
    root = Path(directory).resolve()
    if not isinstance(rel, str) or Path(rel).is_absolute() or ".." in Path(rel).parts:
        raise GoldenFileProblem(f"{rel!r}: a golden file must be named by a relative path inside {directory}")
    path = (root / rel).resolve()
    if root not in path.parents:
        raise GoldenFileProblem(f"{rel!r}: leads out of {directory} (through a symbolic link)")
    return path


def _write_new(directory: Path, rel: str, data: bytes) -> None:
    """Write a file inside the directory as a new file renamed into place: a symbolic link planted at its
    name, or on the way to it, is never written through."""
    target = Path(directory) / rel
    if target.parent.resolve() != Path(directory).resolve() / Path(rel).parent:
        raise GoldenFileProblem(f"{target.parent}: is a symbolic link; golden record writes only inside "
                                f"{directory}")
    replace_whole(target, data)


def _index_data(path: Path) -> dict:
    """index.json as read, checked to be an index of this version whose entries are objects with a name."""
    try:
        data = json.loads(read_bounded(path))
    except Unreadable as e:
        raise GoldenFileProblem(f"{path}: {e}" + (" (run `faverify golden record`)" if not path.exists() else "")) \
            from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GoldenFileProblem(f"{path}: not valid JSON ({e})") from None
    except (RecursionError, ValueError) as e:
        raise GoldenFileProblem(f"{path}: not a golden index ({type(e).__name__})") from None
    if not isinstance(data, dict) or data.get("schema") != "faverify.golden" or data.get("version") != INDEX_VERSION:
        raise GoldenFileProblem(f"{path}: not a version-{INDEX_VERSION} golden index")
    if not isinstance(data.get("cases"), list) or not all(isinstance(e, dict) and "name" in e for e in data["cases"]):
        raise GoldenFileProblem(f"{path}: an entry is not valid; each needs name, case, file and sha256")
    return data


def index(directory: Path = DEFAULT_DIR) -> list:
    path = Path(directory) / "index.json"
    data = _index_data(path)
    try:
        entries = [Entry(e["name"], Case.from_dict(e["case"]), e["file"], e["sha256"]) for e in data["cases"]]
        for e in entries:
            inside(directory, e.file)
        return entries
    except (KeyError, TypeError, UsageError) as e:
        raise GoldenFileProblem(f"{path}: an entry is not valid ({type(e).__name__}: {e}); each needs name, "
                                "case, file and sha256") from None


def read(directory: Path, entry: Entry) -> bytes:
    """The file's bytes, after checking them against the index's sha256."""
    path = inside(directory, entry.file)
    try:
        data = read_bounded(path)
    except Unreadable as e:  # missing, a directory where the file should be, a file that cannot be read
        raise GoldenFileProblem(f"{entry.file}: {'missing' if not path.exists() else e}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.sha256:
        raise GoldenFileProblem(f"{entry.file}: sha256 {digest[:12]}... does not match the index "
                                f"({entry.sha256[:12]}...): truncated or tampered with")
    return data


def decode(data: bytes, entry: Entry, device) -> tuple:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            extras = [torch.from_numpy(z[f"in_{n}"]).to(device) if f"in_{n}" in z.files else None for n in _EXTRAS]
            values = Inputs(*(_unbits(z[f"in_{n}"], entry.case.dtype, device) for n in ("q", "k", "v", "dout")),
                            *extras)
            # only a case with sinks has dsinks, only one with a bias dbias; no stored case asks a max logit
            ref = {n: torch.from_numpy(z[f"ref_{n}"]).to(device) for n in TENSORS
                   if n not in ("dsinks", "dbias", "max_logit") or f"ref_{n}" in z.files}
            scales = {n[len("scale_"):]: torch.tensor(float(z[n]), dtype=torch.float64, device=device)
                      for n in z.files if n.startswith("scale_")}
    except (ValueError, KeyError, OSError) as e:
        raise GoldenFileProblem(f"{entry.file}: cannot be read ({e})") from None
    return values, ref, scales


def load(directory: Path, entry: Entry, device) -> tuple:
    """(inputs in logical layout, reference tensors, scales), after checking the file's sha256."""
    return decode(read(directory, entry), entry, device)
