"""A subject the user names as package.module:function.

function(q, k, v, *, causal, softmax_scale[, init][, window_size, softcap, alibi_slopes, sinks]) takes
[b, s, h, d] tensors and returns out or (out, lse). It may carry a `faverify_capabilities` dict (keys of
subjects.base.Capabilities) to declare what it supports; cases outside it are skipped with the reason.
"""
from __future__ import annotations

import importlib
import os
import sys

from faverify.errors import UsageError
from faverify.files import exit_raises
from faverify.subjects.base import Capabilities, Subject, missing_keywords, takes_init


class _Exited(Exception):
    """The module called os._exit while it was imported."""


def load(spec: str) -> Subject:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UsageError("--kernel", spec, "must be a built-in name or package.module:function")
    if os.getcwd() not in sys.path:  # the console script does not put the working directory on the path
        sys.path.insert(0, os.getcwd())
    try:
        with exit_raises(_Exited, "the module called os._exit({code}) while it was imported"):
            module = importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # any import failure is the user's module, not ours (sys.exit, os._exit too)
        raise UsageError("--kernel", spec, f"cannot import module {module_name!r}: {type(e).__name__}: {e}") from None
    fn = getattr(module, attr, None)
    if fn is None or not callable(fn):
        raise UsageError("--kernel", spec, f"module {module_name!r} has no callable {attr!r}")
    declared = getattr(fn, "faverify_capabilities", None)
    if declared is None:
        declared = {}
    if not isinstance(declared, dict):
        raise UsageError("--kernel", spec, f"faverify_capabilities must be a dict of Capabilities' keys, got "
                                           f"{type(declared).__name__} {declared!r}")
    declared = dict(declared)
    try:
        if "init_modes" not in declared and takes_init(fn):
            declared["init_modes"] = ("-inf", "-1e30")
        caps = Capabilities.of(**declared)
    except (TypeError, ValueError) as e:
        raise UsageError("--kernel", spec, f"faverify_capabilities is not valid: {e}") from None
    missing = missing_keywords(fn, caps)
    if missing:
        raise UsageError("--kernel", spec, f"declares features whose keyword the function does not take: "
                                           f"{', '.join(missing)} (a declared feature is passed by that keyword)")
    doc = (fn.__doc__ or "").strip().splitlines()
    return Subject(name=spec, fn=fn, caps=caps, description=doc[0] if doc else "user function",
                   standalone=STANDALONE.format(module=module_name, function=attr))


# what `repro --standalone` writes for a user's function: run from the directory faverify was run from, or
# with the module on PYTHONPATH
STANDALONE = '''sys.path.insert(0, ".")
from {module} import {function} as attention  # noqa: E402


def call(q, k, v, causal, softmax_scale):
    return attention(q, k, v, causal=causal, softmax_scale=softmax_scale)'''
