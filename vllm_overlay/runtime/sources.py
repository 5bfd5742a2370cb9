"""The patched modules as real files, in a cache shared by every start.

Tracebacks, `inspect` and debuggers read a module's source from the file its
spec names, so the patched modules are files on disk, not strings in memory.
They are written once per series and installed build, under
`<cache>/serve/<series id>-<key>/vllm/...`: the key hashes the series digest
and the sha256 of every original, so the same series over another build of
the release gets its own directory. A directory is assembled beside its final
name and renamed into place under a lock, so no process ever sees half of
one. Its index (`sources.json`, each file's sha256) is checked on every start:
a cached file that was edited or removed is rebuilt, never served.

Applying the series runs `git apply` (see `upstream/applier.py`), so the first start
of a series over a build needs git; later starts only hash a few files.
"""

import hashlib
import json
import tempfile
from collections.abc import Mapping
from pathlib import Path

from vllm_overlay.common import atomic, cache_layout
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locking import exclusive
from vllm_overlay.common.trees import write_tree
from vllm_overlay.runtime.source_overlay import module_name
from vllm_overlay.series.model import Series

INDEX = "sources.json"


def patched_sources(
    series: Series, originals: Mapping[str, bytes], cache: Path
) -> dict[str, Path]:
    """Module name -> patched file, for every file of `originals` (relative
    path -> installed bytes, one per file the series touches)."""
    key = f"{series.series_id}-{_key(series, originals)}"
    directory = cache_layout.serve_sources(cache) / key
    if not _intact(directory, originals):
        try:
            with exclusive(directory.parent):
                if not _intact(directory, originals):
                    _build(directory, series, originals)
        except OSError as exc:
            raise OverlayError(
                f"cannot write the patched sources to {directory}: {exc}"
            ) from None
    return {module_name(relative): directory / relative for relative in originals}


def _key(series: Series, originals: Mapping[str, bytes]) -> str:
    digest = hashlib.sha256(series.digest.encode())
    for relative in sorted(originals):
        content_hash = hashlib.sha256(originals[relative]).hexdigest()
        digest.update(f"\n{relative}\n{content_hash}".encode())
    return digest.hexdigest()[:16]


def _intact(directory: Path, originals: Mapping[str, bytes]) -> bool:
    """Whether the index lists exactly the expected files and each is there
    with its recorded hash."""
    try:
        index = json.loads((directory / INDEX).read_text(encoding="utf-8"))
        return set(index) == set(originals) and all(
            hashlib.sha256((directory / relative).read_bytes()).hexdigest() == sha
            for relative, sha in index.items()
        )
    except (OSError, ValueError, AttributeError, TypeError):
        return False


def _build(directory: Path, series: Series, originals: Mapping[str, bytes]) -> None:
    # Imported here: only a cache miss applies the series, and a warm start
    # should not pay for loading the applier.
    from vllm_overlay.upstream.applier import apply_series

    patched = apply_series(series, originals)
    deleted = sorted(
        relative for relative, content in patched.items() if content is None
    )
    if deleted:
        raise OverlayError(
            f"the series deletes {deleted[0]}, which vllm-overlay serve cannot "
            "remove from an installed vLLM; install the patched wheel"
        )
    files = {
        relative: content
        for relative, content in patched.items()
        if content is not None
    }
    with tempfile.TemporaryDirectory(dir=directory.parent, prefix=".build-") as tmp:
        staging = Path(tmp) / "sources"
        write_tree(staging, files)
        index = {
            relative: hashlib.sha256(content).hexdigest()
            for relative, content in files.items()
        }
        (staging / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True))
        # A damaged copy there is replaced whole.
        atomic.replace_dir(staging, directory)
