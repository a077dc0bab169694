"""Writing a file whole, and the process guards faverify keeps around code it does not own."""
from __future__ import annotations

import contextlib
import os
import posix
from pathlib import Path


def replace_whole(path: Path, data: bytes | str) -> None:
    """Write `data` to a new file beside `path` (refusing a link planted at that name), then rename it over
    `path`: a reader sees the old file or the new one, never half of one; a link at `path` is replaced, not
    followed."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.unlink(missing_ok=True)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    os.replace(temporary, path)


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
