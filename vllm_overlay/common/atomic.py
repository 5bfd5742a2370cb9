"""Writes that a reader sees whole or not at all.

Every file and directory the tools leave for later (the pins, the verdicts,
a series, a cache entry) is written under a scratch name beside its target
and renamed over it: a rename within one directory is atomic, so an
interrupted run leaves the old content, never half of the new.
"""

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replacing(target: Path) -> Iterator[Path]:
    """A scratch path beside `target` for the block to write; renamed over
    `target` when the block succeeds, removed when it fails. The process id
    in its name keeps two writers from sharing one scratch file."""
    scratch = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        yield scratch
        os.replace(scratch, target)
    finally:
        scratch.unlink(missing_ok=True)


def write_text(target: Path, text: str) -> None:
    """`target.write_text(text)`, atomically (UTF-8)."""
    with replacing(target) as scratch:
        scratch.write_text(text, encoding="utf-8")


def write_bytes(target: Path, data: bytes) -> None:
    """`target.write_bytes(data)`, atomically."""
    with replacing(target) as scratch:
        scratch.write_bytes(data)


def replace_dir(staging: Path, target: Path) -> None:
    """Replace the directory `target` (if any) by `staging`, on the same file
    system: two renames, the old directory restored if the second fails, so
    `target` is never half-written; the old one is removed last."""
    if not target.exists():
        os.replace(staging, target)
        return
    old = target.with_name(f".{target.name}-old.{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    os.replace(target, old)
    try:
        os.replace(staging, target)
    except OSError:
        os.replace(old, target)
        raise
    shutil.rmtree(old)
