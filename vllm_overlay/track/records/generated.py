"""The files, or parts of files, that `vllm-overlay table --write` writes and
`table --check` compares: PATCHES.md, README's table of pinned releases and,
in a checkout with release facts, the Installation page's table of what each
release needs. One list, so that writing and checking cannot disagree."""

from pathlib import Path

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.series.facts import FACTS_FILE
from vllm_overlay.track.records import install_table
from vllm_overlay.track.records.readme_table import (
    README_FILE,
    render_release_table,
    with_generated_table,
)
from vllm_overlay.track.records.table import TABLE_FILE


def generated_files(patches_root: Path, patches_table: str) -> dict[Path, str]:
    """Each generated file's path and its full text as it must read, given
    PATCHES.md's text (`patches_table`). The README, and the Installation
    page where release facts exist, must hold their tables' marker lines."""
    checkout = patches_root.parent
    readme = checkout / README_FILE
    if not readme.is_file():
        raise OverlayError(f"no {readme}: its table of pinned releases is generated")
    generated = {
        checkout / TABLE_FILE: patches_table,
        readme: with_generated_table(
            readme.read_text(encoding="utf-8"),
            render_release_table(patches_root),
            readme,
        ),
    }
    if (patches_root / FACTS_FILE).is_file():
        page = checkout / install_table.INSTALL_PAGE
        if not page.is_file():
            raise OverlayError(
                f"no {page}: its table of what each release needs is generated"
            )
        generated[page] = with_generated_table(
            page.read_text(encoding="utf-8"),
            install_table.render_install_table(patches_root),
            page,
            (install_table.BEGIN, install_table.END),
        )
    return generated
