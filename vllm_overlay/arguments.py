"""What the `vllm-overlay` command line accepts: each command, its options
and its one-line summary, the user's commands listed apart from the
maintainer's. `vllm_overlay.cli` runs what `parse` returns.

A refusal here is an `OverlayError` like any other command's, so argparse's
own usage block and exit status 2 never reach the user: every bad input is
one line, printed by `errors.report_error`.
"""

import argparse
import functools
import shlex
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from vllm_overlay.about import version_text
from vllm_overlay.errors import OverlayError
from vllm_overlay.locations import file_in_the_way
from vllm_overlay.series.pins import Dist
from vllm_overlay.track.table import TABLE_FILE

PROG = "vllm-overlay"
SUMMARY = (
    "Patch series over pinned vLLM releases for hybrid models with external KV caches."
)
# What a leftover argument most likely means, per command (default: see its help).
LEFTOVER_HINTS = {
    "doctor": "put vLLM's arguments after `--`: `vllm-overlay doctor "
    "[--without-series] [--peer ARGS] -- [MODEL] [SERVE FLAGS...]`",
}
# A commit of a vLLM clone is named one way by every command and by
# `python -m ci.track_main`: `PATH@REF`. An option spelling it otherwise gets
# this hint, per (command, option).
SOURCE_REF_HINT = "name the commit with the clone: `--source PATH@REF`"
OPTION_HINTS = {
    ("status", "--ref"): SOURCE_REF_HINT,
    ("rebase", "--ref"): SOURCE_REF_HINT,
}
# What `status` exits with, in its --help.
STATUS_EXIT = (
    "exit status: 0 when no patch conflicts (a patch that applies only with "
    "offset, merges (3-way), is already present or is dropped by rebase needs "
    "no hand merge: `rebase` settles it); 1 when any patch conflicts, on an "
    "error, when --record kept earlier verdicts, or (--releases) on a new release"
)
# What may come before the peer's `vllm serve` arguments in `--peer`, so
# that a launch command can be pasted as it is.
SERVE_COMMANDS = (["vllm", "serve"], ["vllm-overlay", "serve"])

Commands = argparse._SubParsersAction


class Parser(argparse.ArgumentParser):
    """argparse's parser, refusing as every command refuses."""

    def error(self, message: str) -> NoReturn:
        # The error printer names the tool; a command's parser names itself.
        where = "" if self.prog == PROG else f"{self.prog}: "
        raise OverlayError(f"{where}{message} (see `{self.prog} --help`)")


class ShowVersion(argparse.Action):
    """`--version`, worked out only when asked: it reads the pins and runs git."""

    def __init__(self, option_strings: list[str], dest: str, help: str) -> None:
        super().__init__(
            option_strings, argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0
        )
        self.help = help

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> NoReturn:
        print(version_text(), end="")
        parser.exit()


def parse(argv: list[str]) -> argparse.Namespace:
    """`argv` as a command and its options. An argument no option takes is
    refused with what it most likely means (`LEFTOVER_HINTS`)."""
    args, leftovers = build_parser().parse_known_args(argv)
    if leftovers:
        command = f"{PROG} {args.command}"
        option = leftovers[0].split("=", 1)[0]
        hint = OPTION_HINTS.get((args.command, option)) or LEFTOVER_HINTS.get(
            args.command, f"see `{command} --help`"
        )
        raise OverlayError(
            f"{command}: unrecognized arguments: {' '.join(leftovers)} ({hint})"
        )
    return args


def build_parser() -> Parser:
    """The whole command line; `--help` lists the user's commands first and
    the maintainer's apart, each with its summary."""
    parser = Parser(
        prog=PROG,
        usage=f"{PROG} [-h] [--version] COMMAND ...",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version",
        action=ShowVersion,
        help="print the tool's version and commit, and each pinned release's "
        "series revision",
    )
    commands = parser.add_subparsers(
        prog=PROG,
        dest="command",
        required=True,
        metavar="COMMAND",
        help=argparse.SUPPRESS,
    )
    user = [add(commands) for add in USER_COMMANDS]
    staff = [add(commands) for add in MAINTAINER_COMMANDS]
    parser.description = "\n\n".join(
        [
            SUMMARY,
            _listing("commands", user),
            _listing("maintainer commands (in a checkout of the repository)", staff),
            f"`{PROG} COMMAND --help` gives a command's options.",
        ]
    )
    return parser


def _listing(title: str, parsers: list[argparse.ArgumentParser]) -> str:
    """`title:` and each command's name with its summary beside it."""
    lines = [f"{title}:"]
    for parser in parsers:
        name = parser.prog.removeprefix(f"{PROG} ")
        lines.append(
            textwrap.fill(
                parser.description or "",
                width=79,
                initial_indent=f"  {name:<9}",
                subsequent_indent=" " * 11,
            )
        )
    return "\n".join(lines)


def _command(
    commands: Commands, name: str, summary: str, **options: object
) -> argparse.ArgumentParser:
    """Command `name`; its one-line `summary` is its line in `vllm-overlay
    --help` and the first line of its own `--help`."""
    return commands.add_parser(name, help=summary, description=summary, **options)


def _output_folder(value: str, names: str = "--out") -> Path:
    """An `--out` folder (or the argument `names`). A file in the way (the
    path or a parent) is refused before any work: the write would fail at
    the end with "File exists"."""
    path = Path(value)
    blocker = file_in_the_way(path)
    if blocker is not None:
        raise argparse.ArgumentTypeError(
            f"{blocker} is a file, and {names} names a folder"
        )
    return path


def _peer_args(value: str) -> list[str]:
    """`doctor --peer`: the other server's `vllm serve` arguments, split as
    a POSIX shell splits them, without a leading `vllm serve` or `--`."""
    try:
        args = shlex.split(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"cannot split {value!r} as a shell does ({exc}); quote the "
            "peer's arguments as one string"
        ) from None
    for command in SERVE_COMMANDS:
        if args[: len(command)] == command:
            args = args[len(command) :]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        raise argparse.ArgumentTypeError(
            "names no arguments; give the other server's `vllm serve` "
            "arguments, its model first"
        )
    return args


# --- the user's commands


def _build(commands: Commands) -> argparse.ArgumentParser:
    build = _command(
        commands,
        "build",
        "build the patched wheel of a pinned release (in a checkout of the repository)",
    )
    build.add_argument(
        "release", nargs="?", help="pinned vLLM release (default: the newest)"
    )
    build.add_argument(
        "--dist",
        choices=[dist.value for dist in Dist],
        default=Dist.VLLM,
        help="upstream distribution to patch (default: vllm)",
    )
    build.add_argument(
        "--out",
        type=_output_folder,
        default="dist",
        metavar="DIR",
        help="the folder the wheel goes into (default: dist)",
    )
    return build


def _serve(commands: Commands) -> argparse.ArgumentParser:
    # Only listed here: `vllm_overlay.launcher` runs `serve` before this
    # module is imported, handing every argument after it to vLLM.
    return _command(
        commands,
        "serve",
        "`vllm serve ARGS...` with the series for the installed vLLM active in "
        "every vLLM process (nothing is installed)",
        add_help=False,
    )


def _doctor(commands: Commands) -> argparse.ArgumentParser:
    doctor = _command(
        commands,
        "doctor",
        "say which `vllm serve` flags fail or silently degrade for hybrid "
        "models with KV connectors, without starting vLLM",
        usage=f"{PROG} doctor [--without-series] [--peer ARGS] [--] [MODEL] "
        "[SERVE FLAGS...]",
    )
    doctor.add_argument(
        "--without-series",
        action="store_true",
        help="judge plain `vllm serve` of an unpatched build (default: as "
        "`vllm-overlay serve` runs it, with the series applied)",
    )
    doctor.add_argument(
        "--peer",
        type=_peer_args,
        metavar="ARGS",
        help="the other server of a prefill/decode pair over NixlConnector: its "
        '`vllm serve` arguments as one quoted string (--peer "MODEL '
        '--speculative-config ..."). Its config is built here too, and what '
        "NIXL's compatibility check would refuse at the first request is "
        "named, speculative decoding first",
    )
    doctor.add_argument(
        "serve_args",
        nargs=argparse.REMAINDER,
        help="the arguments of `vllm serve` (a first flag needs `--` before it)",
    )
    return doctor


USER_COMMANDS: tuple[Callable[[Commands], argparse.ArgumentParser], ...] = (
    _build,
    _serve,
    _doctor,
)


# --- the maintainer's commands


def _status(commands: Commands) -> argparse.ArgumentParser:
    status = _command(
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
    rebase = _command(
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
        type=_output_folder,
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
    refresh = _command(
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
    edit = _command(
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
    pin = _command(
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
    return _command(
        commands,
        "lint",
        "check pins, series files, patch trailers and probe ids, each "
        "series against its release's cached sources, the release facts' "
        "upstream_tests `since` and the deselection ranges",
    )


def _table(commands: Commands) -> argparse.ArgumentParser:
    table = _command(
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
    extract = _command(
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
        type=_output_folder,
        default="extract",
        metavar="DIR",
        help="the folder the PR description and the mbox go into (default: extract)",
    )
    return extract


def _index(commands: Commands) -> argparse.ArgumentParser:
    index = _command(
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
        type=functools.partial(_output_folder, names="OUT_DIR"),
        metavar="OUT_DIR",
        help="a new (or empty) folder: OUT_DIR/simple/ is the index",
    )
    index.add_argument(
        "--wheel-url",
        metavar="URL",
        help="link the wheels at URL/<file> instead of copying them into the "
        "index (where they are hosted, e.g. a GitHub release's assets)",
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
