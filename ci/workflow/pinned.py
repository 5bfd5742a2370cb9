"""What the workflows build and test, read from `releases.toml`, so that
pinning a release takes no workflow edit (the replay of 0.30.0 counted the
release workflow's build list and image matrix and the GPU job's matrix among
its hand edits).

Usage:
    python -m ci.workflow.pinned releases   # the pinned releases, a JSON array
                                            # for a job matrix (`fromJSON`),
                                            # oldest first
    python -m ci.workflow.pinned build DIR  # every pinned release's patched
                                            # wheels, from each distribution
                                            # pinned for this machine's
                                            # platform, into DIR
"""

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

from packaging.tags import Tag, sys_tags
from packaging.version import Version

from vllm_overlay.common.errors import OverlayError, report_error
from vllm_overlay.common.locations import patches_root
from vllm_overlay.series.loader import load_series, pinned_releases
from vllm_overlay.series.pins import Dist
from vllm_overlay.wheel.builder import build_release


def release_matrix(root: Path) -> list[str]:
    """Every pinned release, oldest first."""
    return sorted(pinned_releases(root), key=Version)


def builds_here(
    root: Path, tags: Iterable[Tag] | None = None
) -> list[tuple[str, Dist]]:
    """(release, distribution) of every pinned wheel that installs on a
    platform of `tags` (this machine's by default), oldest release first."""
    supported = set(sys_tags() if tags is None else tags)
    pins = pinned_releases(root)
    return [
        (version, dist)
        for version in sorted(pins, key=Version)
        for dist in Dist
        if any(
            wheel.dist == dist and wheel.tags & supported
            for wheel in pins[version].wheels
        )
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("releases", help="the pinned releases as a JSON array")
    build = commands.add_parser("build", help="every pinned wheel this platform takes")
    build.add_argument("out", type=Path, help="the folder the wheels go into")
    args = parser.parse_args(argv)
    root = patches_root()
    try:
        if args.command == "releases":
            print(json.dumps(release_matrix(root)))
            return 0
        planned = builds_here(root)
        if not planned:
            raise OverlayError("no pinned wheel installs on this platform")
        pins = pinned_releases(root)
        for version, dist in planned:
            print(build_release(load_series(root, pins[version]), dist, args.out))
    except OverlayError as exc:
        report_error(exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
