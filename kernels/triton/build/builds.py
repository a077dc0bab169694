"""The Triton builds a subject's calls need, listed and compiled for a named GPU on any machine.

A build is a kernel as Triton specializes it: its constants, argument types and alignment, and its options
(warps, stages), for one target. Triton keys its on-disk cache by a hash of these, of the compiler and of
the target (triton/runtime/cache.py, get_cache_key), and a launch whose build is in the cache loads it in
milliseconds. `listing` runs the launchers on CPU tensors with Triton's driver answering for the named GPU
(build/target.py makes the launchers decide for it too). Triton's cache hook takes each launch before it
compiles: it computes the build's key, compiles the build into the cache where this process claimed it
(claims: one process a build, whatever the number of processes listing at once), and skips the launch.
The compile is the one JITFunction.run would make on that GPU, so a worker there finds it and only loads.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import time
from dataclasses import dataclass

from faverify.kernels.triton.build.target import Target, named


@dataclass(frozen=True)
class Built:
    """One build a call needed, as this process met it first."""
    key: str  # Triton's cache directory for it (knobs.cache.dir/KEY)
    kernel: str  # the kernel's qualified name
    # compiled: compiled here; cached: found in the cache; claimed: another process claimed it; listed: not
    # compiled (listing without compile); failed: the compiler raised (error)
    outcome: str
    seconds: float = 0.0
    error: str = ""
    parts: tuple = ()  # (part, its hash) of the key (key_parts): what tells two machines' keys apart

    def to_dict(self) -> dict:
        return {"key": self.key, "kernel": self.kernel, "outcome": self.outcome, "seconds": round(self.seconds, 3),
                "error": self.error, "parts": dict(self.parts)}


class _Driver:
    """What JITFunction.run asks of Triton's driver before it compiles, answered for a named GPU."""

    def __init__(self, target: Target):
        from triton.backends.compiler import GPUTarget
        self.target = GPUTarget("cuda", target.capability, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device=None) -> int:
        return 0

    def get_current_target(self):
        return self.target


class Lister:
    """Triton's jit_cache_hook while listing: each build once per process, compiled where claimed."""

    def __init__(self, claims: str | None = None, compile: bool = True):
        self.claims, self.compile = claims, compile
        self.built: list = []  # Built, in the order first met
        self._seen: set = set()

    def hook(self, *, key, repr, fn, compile, is_manual_warmup, already_compiled) -> bool:
        jit = fn.jit_function
        src, options, target, backend = _source(jit, compile)
        directory = cache_key(src, backend, options)
        if directory not in self._seen:
            self._seen.add(directory)
            built = self._make(jit, src, options, target, directory)
            self.built.append(dataclasses.replace(built, parts=tuple(key_parts(src, backend, options).items())))
        return True  # the launch is skipped: nothing runs under a named target

    def take(self) -> list:
        """The builds met since the last take."""
        built, self.built = self.built, []
        return built

    def _make(self, jit, src, options, target, directory: str) -> Built:
        name = f"{jit.fn.__module__}.{jit.fn.__qualname__}"
        if not self.compile:
            return Built(directory, name, "listed")
        if not self._claim(directory):
            return Built(directory, name, "claimed")
        from triton import knobs
        hits: list = []
        listener = knobs.compilation.listener
        knobs.compilation.listener = lambda **event: hits.append(bool(event.get("cache_hit")))
        start = time.perf_counter()
        try:
            jit.compile(src, target=target, options=options.__dict__)  # JITFunction._do_compile's own call
        except Exception as e:  # the GPU's JIT would raise the same at the launch: the cases will say so
            return Built(directory, name, "failed", time.perf_counter() - start,
                         f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300] if str(e).strip() else ''}")
        finally:
            knobs.compilation.listener = listener
        return Built(directory, name, "cached" if any(hits) else "compiled", time.perf_counter() - start)

    def _claim(self, directory: str) -> bool:
        if self.claims is None:
            return True
        try:
            os.close(os.open(os.path.join(self.claims, directory), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True


def _source(jit, compile: dict) -> tuple:
    """(source, options, target, backend) of the build the hook was called for, as JITFunction._do_compile
    makes them: the options are parsed again from the specialization Triton serialized for the hook (as
    JITFunction.preload does), the rest are its own objects."""
    _, _, target, backend, _ = jit.device_caches[0]
    data = json.loads(compile["specialization_data"])
    options = backend.parse_options({k: tuple(v) if isinstance(v, list) else v for k, v in data["options"].items()})
    src = jit.ASTSource(jit, compile["signature"], compile["constants"], compile["configs"][0])
    return src, options, target, backend


def cache_key(src, backend, options) -> str:
    """The directory Triton's cache keeps the build in (triton.compiler.compile computes it so): a hash of
    Triton itself (its sources and libtriton), the build, the backend (ptxas's version and the arch), the
    options and the environment variables that change a compile."""
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.runtime.cache import _base32, get_cache_key
    text = get_cache_key(src, backend, options, get_cache_invalidating_env_vars())
    return _base32(hashlib.sha256(text.encode("utf-8")).hexdigest())


def key_parts(src, backend, options) -> dict:
    """What cache_key hashes, part by part, each part's hash cut short: Triton itself, the build's source
    (the kernel's code, constants, argument types and alignment), the backend (ptxas's version and the
    arch), the options, the environment. Where a machine misses another's build, the parts that differ say
    why."""
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.runtime.cache import triton_key

    def short(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    return {"triton": short(triton_key()), "source": src.hash()[:16], "backend": short(backend.hash()),
            "options": options.hash()[:16], "env": short(str(sorted(get_cache_invalidating_env_vars().items())))}


def key_fields(target: Target) -> dict:
    """The parts of every build's key that are not the build's own, for a target: two machines whose fields
    agree key the same build alike (devtools/warm_cache.py compares them)."""
    import sysconfig

    from triton import __version__
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.cache import triton_key
    backend = make_backend(GPUTarget("cuda", target.capability, 32))
    return {"triton": __version__, "triton_key": hashlib.sha256(triton_key().encode()).hexdigest()[:16],
            "python_abi": sysconfig.get_config_var("SOABI"), "backend": backend.hash(),
            "env": dict(sorted(get_cache_invalidating_env_vars().items()))}


@contextlib.contextmanager
def listing(target: Target, claims: str | None = None, compile: bool = True):
    """Calls in the block launch nothing: each build they need is listed (Lister.built) and, with compile,
    compiled into Triton's cache for `target`. The block's tensors are the CPU's."""
    from triton import knobs
    from triton.runtime.driver import driver
    lister = Lister(claims, compile)
    hook, active = knobs.runtime.jit_cache_hook, driver._active  # no default driver without a GPU to reset to
    driver.set_active(_Driver(target))
    knobs.runtime.jit_cache_hook = lister.hook
    try:
        with named(target):
            yield lister
    finally:
        knobs.runtime.jit_cache_hook = hook
        driver.set_active(active)
