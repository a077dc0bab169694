"""Reading and writing the files faverify is given or asked for, and the process guards faverify keeps around
code it does not own.

A file faverify reads (a run file, a case, a golden index) is read only where it is a regular file, and at
most READ_LIMIT bytes of it: a device (/dev/zero), a FIFO or a file of gigabytes is refused in one line, not
read for ever. A file faverify writes is written whole or not at all: into a new file beside it, then
renamed over it, so a full disk leaves the old file (or none) and no empty or half-written one.
"""
from __future__ import annotations

import contextlib
import errno
import os
import posix
import stat
import tempfile
from pathlib import Path

from faverify.errors import EnvironmentProblem, UsageError

READ_LIMIT = 256 << 20  # bytes: a shard's run file of 10^5 cases, with its per-case values, is tens of MB


class Unreadable(Exception):
    """A file read_bounded would not read: the rule it broke, in words (the caller names the file)."""


def describe(error: OSError) -> str:
    """An OSError as a user reads it: the system's words and the errno's name ("No space left on device,
    ENOSPC")."""
    name = errno.errorcode.get(error.errno, "")
    return f"{error.strerror or error}" + (f", {name}" if name else "")


def read_bounded(path, limit: int | None = None) -> bytes:
    """The bytes of the regular file at `path`, refused (Unreadable) where it is anything else, is larger
    than `limit` bytes (READ_LIMIT unless given) or cannot be read. Opened without blocking: a FIFO with no
    writer is refused, not waited on."""
    limit = READ_LIMIT if limit is None else limit
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise Unreadable("does not exist") from None
    except OSError as e:
        raise Unreadable(f"cannot be read ({describe(e)})") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise Unreadable("is a directory; give a file")
        if not stat.S_ISREG(mode):
            raise Unreadable("is not a regular file (a device, a FIFO or a socket); give a file")
        chunks, size = [], 0
        while size <= limit and (chunk := os.read(fd, min(1 << 20, limit + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise Unreadable(f"cannot be read ({describe(e)})") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise Unreadable(f"is larger than {limit:,} bytes, the most faverify reads of a file")
    return data


def replace_whole(path: Path, data: bytes | str) -> None:
    """Write `data` to a new file beside `path` (refusing a link planted at that name), then rename it over
    `path`: a reader sees the old file or the new one, never half of one; a link at `path` is replaced, not
    followed. A write the system refuses (a full disk, a directory at `path`) is an EnvironmentProblem naming
    the path and the errno, and leaves nothing of the new file behind."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        temporary.unlink(missing_ok=True)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        raise EnvironmentProblem(f"{path}: cannot be written ({describe(e)})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except OSError as e:
        temporary.unlink(missing_ok=True)
        raise EnvironmentProblem(f"{path}: cannot be written ({describe(e)})") from None


@contextlib.contextmanager
def exit_raises(error: type, message: str):
    """While the block runs, os._exit(code) raises error(message with {code} filled in) instead of ending the
    process: code run in faverify's own process would otherwise end it with the code's exit status, 0 a
    pass for nothing."""
    originals = os._exit, posix._exit

    def refuse(code=0):
        raise error(message.format(code=code))
    os._exit = posix._exit = refuse
    try:
        yield
    finally:
        os._exit, posix._exit = originals


def check_writable(option: str, path, *, directory: bool = False) -> None:
    """Before any case runs: a file the run was asked to write must be writable when the run ends, so a
    long run is not lost to a typo (a path under a file, a directory where a file should go, a FIFO or a
    device where a file should go, a link to nothing). Creates the missing folders, as the write would;
    writes nothing else. Call it after the kernels' names were checked: a wrong name creates no folder."""
    if path is None:
        return
    path = Path(path)
    folder = path if directory else path.parent
    if not directory and path.is_dir():
        raise UsageError(option, str(path), "is a directory; give the path of a file to write")
    if path.is_symlink() and not path.exists():
        raise UsageError(option, str(path), "is a symbolic link to a file that does not exist")
    if not directory and path.exists() and not stat.S_ISREG(path.stat().st_mode):
        raise UsageError(option, str(path), "is not a regular file (a FIFO, a device or a socket): give a file")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".faverify-write-check-"):
            pass
    except OSError as e:
        raise UsageError(option, str(path), f"cannot be written ({e.strerror or e}: {folder})") from None
    if not directory and path.exists() and not os.access(path, os.W_OK):
        raise UsageError(option, str(path), "exists and cannot be written")


def check_distinct(**paths) -> None:
    """Two outputs of one command may not be the same file: the second would overwrite the first."""
    seen: dict = {}
    for option, path in paths.items():
        if path is None:
            continue
        key = os.path.realpath(path)
        flag = "--" + option.replace("_", "-")
        if key in seen:
            raise UsageError(flag, str(path), f"is the same file as {seen[key]}: give each output its own path")
        seen[key] = flag
