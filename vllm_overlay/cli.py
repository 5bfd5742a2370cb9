"""The `vllm-overlay` command line."""

import argparse
import sys
from pathlib import Path

from vllm_overlay.errors import OverlayError
from vllm_overlay.lint import lint
from vllm_overlay.locations import patches_root
from vllm_overlay.pins import DISTRIBUTIONS
from vllm_overlay.release import build_release


def _build(args: argparse.Namespace) -> int:
    wheel = build_release(args.release, args.dist, args.out)
    print(wheel)
    return 0


def _lint(args: argparse.Namespace) -> int:
    problems = lint(patches_root())
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"vllm-overlay lint: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("vllm-overlay lint: the series are well-formed")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-overlay",
        description="Patch series over pinned vLLM releases for hybrid models "
        "with external KV caches.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser(
        "build", help="build the patched wheel of a pinned release"
    )
    build.add_argument(
        "release", nargs="?", help="pinned vLLM release (default: the newest)"
    )
    build.add_argument(
        "--dist",
        choices=DISTRIBUTIONS,
        default="vllm",
        help="upstream distribution to patch (default: vllm)",
    )
    build.add_argument(
        "--out", type=Path, default=Path("dist"), help="output directory (dist)"
    )
    build.set_defaults(func=_build)
    check = commands.add_parser(
        "lint", help="check pins, series files, patch trailers and probe ids"
    )
    check.set_defaults(func=_lint)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.func(args)
    except OverlayError as exc:
        print(f"vllm-overlay: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("vllm-overlay: interrupted; nothing was written", file=sys.stderr)
        return 130
