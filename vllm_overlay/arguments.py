"""What the `vllm-overlay` command line accepts: each command, its options
and its one-line summary, the user's commands (here) listed apart from the
maintainer's (`vllm_overlay.track.arguments`). `vllm_overlay.cli` runs what
`parse` returns.

A refusal here is an `OverlayError` like any other command's, so argparse's
own usage block and exit status 2 never reach the user: every bad input is
one line, printed by `errors.report_error`.
"""

import argparse
import shlex
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from vllm_overlay.about import version_text
from vllm_overlay.argparsing import PROG, Commands, Parser, command, output_folder
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.series.pins import Dist
from vllm_overlay.track.arguments import MAINTAINER_COMMANDS

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
# What may come before the peer's `vllm serve` arguments in `--peer`, so
# that a launch command can be pasted as it is.
SERVE_COMMANDS = (["vllm", "serve"], ["vllm-overlay", "serve"])


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
        named = f"{PROG} {args.command}"
        option = leftovers[0].split("=", 1)[0]
        hint = OPTION_HINTS.get((args.command, option)) or LEFTOVER_HINTS.get(
            args.command, f"see `{named} --help`"
        )
        raise OverlayError(
            f"{named}: unrecognized arguments: {' '.join(leftovers)} ({hint})"
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
    for serve in SERVE_COMMANDS:
        if args[: len(serve)] == serve:
            args = args[len(serve) :]
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
    build = command(
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
        type=output_folder,
        default="dist",
        metavar="DIR",
        help="the folder the wheel goes into (default: dist)",
    )
    return build


def _serve(commands: Commands) -> argparse.ArgumentParser:
    # Only listed here: `vllm_overlay.launcher` runs `serve` before this
    # module is imported, handing every argument after it to vLLM.
    return command(
        commands,
        "serve",
        "`vllm serve ARGS...` with the series for the installed vLLM active in "
        "every vLLM process (nothing is installed)",
        add_help=False,
    )


def _doctor(commands: Commands) -> argparse.ArgumentParser:
    doctor = command(
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


def _verify(commands: Commands) -> argparse.ArgumentParser:
    verify = command(
        commands,
        "verify",
        "say whether a patched wheel, or the installed vLLM, is exactly "
        "upstream's pinned wheel plus this vllm-overlay's series (rebuilt here and "
        "compared)",
    )
    what = verify.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "wheel",
        nargs="?",
        type=Path,
        metavar="WHEEL",
        help="a patched build's wheel file (vllm-RELEASE+hybridkv.N-...whl)",
    )
    what.add_argument(
        "--installed",
        action="store_true",
        help="the vLLM installed where vllm-overlay runs: each file it installed",
    )
    return verify


def _install(commands: Commands) -> argparse.ArgumentParser:
    install = command(
        commands,
        "install",
        "build the patched build of the installed vLLM here, from upstream's "
        "pinned wheel and this vllm-overlay's series, and install it over it "
        "(run with the Python that runs vLLM)",
    )
    install.add_argument(
        "--revert", action="store_true", help="put upstream's wheel back instead"
    )
    install.add_argument(
        "--dry-run", action="store_true", help="say what it would do; change nothing"
    )
    return install


USER_COMMANDS: tuple[Callable[[Commands], argparse.ArgumentParser], ...] = (
    _build,
    _install,
    _serve,
    _doctor,
    _verify,
)
