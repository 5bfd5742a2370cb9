"""A wheel's RECORD: the one reader and writer, for the builder and the runtime.

Each row is `path,sha256=<urlsafe base64, unpadded>,size` (the binary
distribution format, "The RECORD file"). The builder checks every file it
patches against its source wheel's RECORD and writes a new one; `serve`
checks every installed file it overlays against the installed RECORD, so a
locally edited install is refused rather than patched. Kept to the standard
library: `serve` imports it on its start-up path.
"""

import base64
import csv
import hashlib
import io
from collections.abc import Iterable

RecordRow = tuple[str, str, str]


def record_hash(content: bytes) -> str:
    """The hash of `content` as a RECORD writes it."""
    digest = hashlib.sha256(content).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def parse_record(text: str) -> dict[str, tuple[str, str]]:
    """Path -> (hash, size) for every row of a RECORD; a field a row leaves
    out (the RECORD's own row has neither) is empty."""
    return {
        row[0]: (row[1], row[2])
        for row in ([*r, "", ""] for r in csv.reader(io.StringIO(text)) if r)
    }


def record_text(rows: Iterable[RecordRow]) -> str:
    """A RECORD holding `rows`, in their order."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue()
