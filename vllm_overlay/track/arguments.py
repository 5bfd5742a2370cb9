"""The maintainer's commands of the `vllm-overlay` command line (in a
checkout of the repository): each command's options and its one-line
summary. `vllm_overlay.arguments` lists them apart from the user's.
"""

import argparse
import functools
from collections.abc import Callable
from pathlib import Path

from vllm_overlay.argparsing import Commands, command, output_folder
from vllm_overlay.series.pins import Dist
from vllm_overlay.track.records.table import TABLE_FILE

# What `status` exits with, in its --help.
STATUS_EXIT = (
    "exit status: 0 when no patch conflicts (a patch that applies only with "
    "offset, merges (3-way), is already present or is dropped by rebase needs "
    "no hand merge: `rebase` settles it); 1 when any patch conflicts, on an "
    "error, when --record kept earlier verdicts, or (--releases) on a new release"
)


def _status(commands: Commands) -> argparse.ArgumentParser:
    status = command(
        commands,
        "status",
        "how each patch of the nearest series fares against vLLM releases",
        epilog=STATUS_EXIT,
    )
    status.add_argument(
        "releases",
        nargs="*",
        metavar="RELEASE",
        help="vLLM releases, pinned or not (default: every pinned release)",
    )
    status.add_argument(
        "--source",
        metavar="PATH[@REF]",
        help="check a vLLM git clone at REF (default HEAD) instead of releases, "
        "upstream's test hunks too",
    )
    status.add_argument("--json", action="store_true", help="print JSON rows")
    status.add_argument(
        "--probe",
        action="store_true",
        help="also run each patch's probes on the unpatched release, in its "
        "cached test environment (still needed / upstream-equivalent)",
    )
    status.add_argument(
        "--record",
        action="store_true",
        help=f"keep each pinned release's verdicts for the {TABLE_FILE} column "
        "'Last status' and regenerate it",
    )
    status.add_argument(
        "--releases", dest="watch", action="store_true", help="the release watch"
    )
    return status


def _rebase(commands: Commands) -> argparse.ArgumentParser:
    rebase = command(
        commands,
        "rebase",
        "replay a release's series onto another pinned release (3-way)",
    )
    rebase.add_argument(
        "releases", nargs="*", metavar="FROM TO", help="the two pinned releases"
    )
    rebase.add_argument(
        "--source",
        metavar="PATH[@REF]",
        help="replay FROM onto a vLLM git clone at REF (default HEAD) instead of "
        "a release; the series goes to --out, nothing is pinned",
    )
    rebase.add_argument(
        "--out",
        type=output_folder,
        metavar="DIR",
        help="with --source: the new folder",
    )
    step = rebase.add_mutually_exclusive_group()
    step.add_argument(
        "--continue",
        dest="resume",
        action="store_true",
        help="go on after resolving the conflict of the stopped patch",
    )
    step.add_argument(
        "--skip", action="store_true", help="drop the stopped patch and go on"
    )
    step.add_argument(
        "--abort", action="store_true", help="give the rebase up; nothing is written"
    )
    return rebase


def _refresh(commands: Commands) -> argparse.ArgumentParser:
    refresh = command(
        commands, "refresh", "re-export a release's series from a patched git tree"
    )
    refresh.add_argument("release", help="pinned vLLM release")
    refresh.add_argument(
        "--repo",
        type=Path,
        help="git work tree: upstream files plus one commit a patch",
    )
    refresh.add_argument("--base", help="the commit of the pristine files")
    refresh.add_argument(
        "--check",
        action="store_true",
        help="fail if the series is not what a refresh of itself writes",
    )
    return refresh


def _edit(commands: Commands) -> argparse.ArgumentParser:
    edit = command(
        commands,
        "edit",
        "open a release's series as a git tree to edit (refresh writes it back)",
    )
    edit.add_argument("release", help="pinned vLLM release")
    edit.add_argument("dir", type=Path, metavar="DIR", help="a new folder")
    edit.add_argument(
        "--file",
        action="append",
        default=[],
        metavar="PATH",
        dest="files",
        help="also upstream's PATH (vllm/... or tests/...), for a change the "
        "series does not touch yet; repeatable",
    )
    return edit


def _pin(commands: Commands) -> argparse.ArgumentParser:
    pin = command(
        commands,
        "pin",
        "pin a release's sdist and wheels, with sha256, in releases.toml, and "
        "the packages its test environment takes as tested in release-facts.toml "
        "(--bump: record a changed series under a new revision)",
    )
    pin.add_argument("release", help="the vLLM release")
    pin.add_argument(
        "--dist",
        action="append",
        choices=[dist.value for dist in Dist],
        help="a distribution whose wheels to pin, repeatable (default: every "
        "known one that has wheels)",
    )
    pin.add_argument(
        "--bump",
        action="store_true",
        help="record the release's current series next to its revision, "
        "incrementing the revision when the recorded series changed",
    )
    return pin


def _lint(commands: Commands) -> argparse.ArgumentParser:
    return command(
        commands,
        "lint",
        "check pins, series files, patch trailers and probe ids, each "
        "series against its release's cached sources, the release facts' "
        "upstream_tests `since` and the deselection ranges",
    )


def _table(commands: Commands) -> argparse.ArgumentParser:
    table = command(
        commands, "table", f"print the generated {TABLE_FILE} (or --write / --check it)"
    )
    mode = table.add_mutually_exclusive_group()
    mode.add_argument(
        "--write",
        action="store_true",
        help=f"rewrite {TABLE_FILE} and README's table of pinned releases",
    )
    mode.add_argument(
        "--check", action="store_true", help="fail if either is out of date"
    )
    return table


def _extract(commands: Commands) -> argparse.ArgumentParser:
    extract = command(
        commands, "extract", "turn one patch into an upstream-ready contribution"
    )
    extract.add_argument("patch", help="patch file name (with or without .patch)")
    extract.add_argument(
        "--base", help="pinned release whose series holds it (default: the newest)"
    )
    extract.add_argument(
        "--repo",
        type=Path,
        help="a vLLM git checkout: apply the contribution there on a new branch",
    )
    extract.add_argument(
        "--out",
        type=output_folder,
        default="extract",
        metavar="DIR",
        help="the folder the PR description and the mbox go into (default: extract)",
    )
    return extract


def _index(commands: Commands) -> argparse.ArgumentParser:
    index = command(
        commands,
        "index",
        "write a PEP 503 simple index of a folder of built wheels as static "
        "files, with SHA256SUMS, for pip's --extra-index-url",
    )
    index.add_argument(
        "dist", type=Path, metavar="DIST_DIR", help="the folder of wheels, only wheels"
    )
    index.add_argument(
        "out",
        type=functools.partial(output_folder, names="OUT_DIR"),
        metavar="OUT_DIR",
        help="a new (or empty) folder: OUT_DIR/simple/ is the index",
    )
    index.add_argument(
        "--wheel-url",
        metavar="URL",
        help="link the wheels at URL/<file> instead of copying them into the "
        "index (where they are hosted, e.g. a GitHub release's assets); "
        "writes OUT_DIR/wheels.json, the listing of them",
    )
    index.add_argument(
        "--earlier",
        type=Path,
        metavar="DIR",
        help="a folder of earlier releases' wheels.json listings, saved as "
        "<tag>.json: the index links their wheels too (needs --wheel-url)",
    )
    return index


MAINTAINER_COMMANDS: tuple[Callable[[Commands], argparse.ArgumentParser], ...] = (
    _status,
    _rebase,
    _edit,
    _refresh,
    _pin,
    _lint,
    _table,
    _extract,
    _index,
)
