"""The release workflow's check of a draft release before it is made public.

The publish job uploads its assets into a draft, downloads them back with
`gh release download` and runs this on the two folders; only then does it
publish the release (and the index that links it). What it refuses:

- an asset missing, added or renamed: GitHub renames an asset whose name has a
  character it does not take (a `+` has been reported turned into `.` or
  `-`), which would break the index's links;
- an asset whose bytes differ from the file sent;
- `SHA256SUMS` and `wheels.json` that do not list, with their right sha256,
  exactly the patched wheels (every wheel asset but vllm-overlay's own);
- a patched wheel without its CycloneDX SBOM (`<wheel>.cdx.json`), or one whose
  subject is not that wheel's project and version, or that lists no
  dependencies or one without a purl (`ci/workflow/sbom.py` writes them).

The build provenance attestations are checked by `gh attestation verify` in
the workflow itself: they live in GitHub's attestation store, not here.

Usage:
    python -m ci.workflow.release_assets DRAFT_DIR SENT_FILE...
"""

import argparse
import json
import sys
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from vllm_overlay.common.errors import OverlayError, report_error
from vllm_overlay.upstream.fetch import sha256_of
from vllm_overlay.wheel.index import LISTING_FILE, SUMS_FILE, read_listing

TOOL_PROJECT = canonicalize_name("vllm-overlay")
SBOM_SUFFIX = ".cdx.json"


def asset_problems(draft: Path, sent: list[Path]) -> list[str]:
    """Every problem of the draft's assets (the files in `draft`) against
    the files `sent`; empty when the release may be made public."""
    kept = {path.name: path for path in draft.iterdir() if path.is_file()}
    sent_by_name = {path.name: path for path in sent}
    problems = [
        f"{name} was sent but the draft has no asset of that name (renamed?)"
        for name in sorted(set(sent_by_name) - set(kept))
    ]
    problems += [
        f"the draft has {name}, which was not sent"
        for name in sorted(set(kept) - set(sent_by_name))
    ]
    problems += [
        f"{name}: the draft's bytes differ from the file sent"
        for name in sorted(set(kept) & set(sent_by_name))
        if sha256_of(kept[name]) != sha256_of(sent_by_name[name])
    ]
    if problems:
        return problems
    return _listed_problems(kept) + _sbom_problems(kept)


def _patched_wheels(kept: dict[str, Path]) -> list[str]:
    return sorted(
        name
        for name in kept
        if name.endswith(".whl") and parse_wheel_filename(name)[0] != TOOL_PROJECT
    )


def _listed_problems(kept: dict[str, Path]) -> list[str]:
    """SHA256SUMS and the listing each name every patched wheel once, with
    the sha256 of its asset."""
    truth = {name: sha256_of(kept[name]) for name in _patched_wheels(kept)}
    problems = []
    for name in (SUMS_FILE, LISTING_FILE):
        if name not in kept:
            problems.append(f"the draft has no {name}")
    if problems:
        return problems
    sums = {}
    for line in kept[SUMS_FILE].read_text(encoding="utf-8").splitlines():
        digest, _, filename = line.partition("  ")
        sums[filename] = digest
    listed = {
        wheel.filename: wheel.sha256 for wheel in read_listing(kept[LISTING_FILE])
    }
    for name, said in ((SUMS_FILE, sums), (LISTING_FILE, listed)):
        if said != truth:
            wrong = sorted(set(said.items()) ^ set(truth.items()))
            problems.append(
                f"{name} does not list exactly the patched wheels with their "
                f"sha256: {', '.join(filename for filename, _ in wrong)}"
            )
    return problems


def _sbom_problems(kept: dict[str, Path]) -> list[str]:
    """Each patched wheel's SBOM is CycloneDX and lists the wheel itself."""
    problems = []
    for name in _patched_wheels(kept):
        sbom = kept.get(name + SBOM_SUFFIX)
        if sbom is None:
            problems.append(f"{name} has no SBOM ({name}{SBOM_SUFFIX})")
            continue
        project, version, _, _ = parse_wheel_filename(name)
        try:
            bom = json.loads(sbom.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            problems.append(f"{sbom.name} is not JSON: {exc}")
            continue
        if not isinstance(bom, dict) or bom.get("bomFormat") != "CycloneDX":
            problems.append(f"{sbom.name} is not a CycloneDX SBOM")
            continue
        subject = (bom.get("metadata") or {}).get("component")
        if not _describes(subject, project, version):
            problems.append(f"{sbom.name} is not the SBOM of {project} {version}")
        components = bom.get("components") or []
        unnamed = [
            str(c.get("name")) if isinstance(c, dict) else repr(c)
            for c in components
            if not (isinstance(c, dict) and str(c.get("purl", "")).startswith("pkg:"))
        ]
        if not components or unnamed:
            problems.append(
                f"{sbom.name} lists no dependencies, or some without a purl: "
                f"{', '.join(unnamed) or 'none listed'}"
            )
    return problems


def _describes(component: object, project: str, version: Version) -> bool:
    if not isinstance(component, dict):
        return False
    try:
        said = Version(str(component.get("version")))
    except InvalidVersion:
        return False
    name = canonicalize_name(str(component.get("name")))
    return name == project and said == version


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ci.workflow.release_assets", description=__doc__.split("\n")[0]
    )
    parser.add_argument("draft", type=Path, help="the draft's assets, downloaded")
    parser.add_argument("sent", type=Path, nargs="+", help="the files uploaded")
    args = parser.parse_args(argv)
    try:
        if not args.draft.is_dir():
            raise OverlayError(f"{args.draft} is not a folder of downloaded assets")
        missing = [str(path) for path in args.sent if not path.is_file()]
        if missing:
            raise OverlayError(f"not a file sent: {', '.join(missing)}")
        problems = asset_problems(args.draft, args.sent)
    except OverlayError as exc:
        report_error(exc)
        return 1
    for problem in problems:
        print(f"::error::{problem}", file=sys.stderr)
    if not problems:
        print(f"{len(args.sent)} assets checked: the draft may be made public")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
