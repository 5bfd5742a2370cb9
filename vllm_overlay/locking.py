"""Advisory locks on directories, so that two builds or downloads never
interleave their writes."""

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def exclusive(directory: Path) -> Iterator[None]:
    """Hold an exclusive `flock` on `directory` (created if needed) for the block.

    Locking the directory itself leaves no lock file behind, and the kernel
    drops the lock if the process dies, so an interrupted build can never leave
    a stale lock.
    """
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
