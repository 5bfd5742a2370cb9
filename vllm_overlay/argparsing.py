"""What every command's parser shares: the parser class that refuses as
every command refuses, how a command is added, and the argument types more
than one command takes. `vllm_overlay.arguments` (the user's commands) and
`vllm_overlay.track.arguments` (the maintainer's) build on it.
"""

import argparse
from pathlib import Path
from typing import NoReturn

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import file_in_the_way

PROG = "vllm-overlay"

Commands = argparse._SubParsersAction


class Parser(argparse.ArgumentParser):
    """argparse's parser, refusing as every command refuses."""

    def error(self, message: str) -> NoReturn:
        # The error printer names the tool; a command's parser names itself.
        where = "" if self.prog == PROG else f"{self.prog}: "
        raise OverlayError(f"{where}{message} (see `{self.prog} --help`)")


def command(
    commands: Commands, name: str, summary: str, **options: object
) -> argparse.ArgumentParser:
    """Command `name`; its one-line `summary` is its line in `vllm-overlay
    --help` and the first line of its own `--help`."""
    return commands.add_parser(name, help=summary, description=summary, **options)


def output_folder(value: str, names: str = "--out") -> Path:
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
