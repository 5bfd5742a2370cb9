"""Advisory file locks, so that two builds or downloads never interleave writes."""

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive `flock` on `lock_path` (created if needed) for the block.

    The lock is released by the kernel if the process dies, so an interrupted
    build can never leave a stale lock behind.
    """
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
