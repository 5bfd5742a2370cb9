"""A set of files held as relative path -> bytes, written out as a tree.

Every stage holds files that way: the upstream files a series touches, what
the series makes of them, the content of a scratch repository. One writer
lays them out on disk for all of them.
"""

from collections.abc import Mapping
from pathlib import Path


def write_tree(root: Path, files: Mapping[str, bytes]) -> None:
    """Write each of `files` under `root`, making the directories it needs."""
    for name, content in files.items():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
