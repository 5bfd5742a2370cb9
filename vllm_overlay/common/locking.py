"""Advisory locks on directories, so that two builds or downloads never
interleave their writes."""

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import file_in_the_way


@contextmanager
def exclusive(directory: Path) -> Iterator[None]:
    """Hold an exclusive `flock` on `directory` (created if needed) for the block.

    Locking the directory itself leaves no lock file behind, and the kernel
    drops the lock if the process dies, so an interrupted build can never leave
    a stale lock. A file where the directory or one of its parents belongs
    (a cache folder overwritten by hand) is refused with the one error
    line, not a traceback from `mkdir`.
    """
    blocker = file_in_the_way(directory)
    if blocker is not None:
        raise OverlayError(
            f"cannot lock {directory}: {blocker} is a file where a folder "
            "belongs; move it away"
        )
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
