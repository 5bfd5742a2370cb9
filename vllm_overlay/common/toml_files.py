"""The one reader of the project's TOML files (the pins, the release facts,
the deselections, the verdicts, the release watch): a file that is missing,
unreadable or not TOML is one `OverlayError` naming it, whoever reads it."""

import tomllib
from pathlib import Path
from typing import Any

from vllm_overlay.common.errors import OverlayError


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """The table `path` holds; `what` names a missing file (`"pins file"`).
    Every error starts with the path or with `what` and the path."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise OverlayError(f"{what} {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise OverlayError(f"cannot read {path}: {exc}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise OverlayError(f"{path} is not valid TOML: {exc}") from None
