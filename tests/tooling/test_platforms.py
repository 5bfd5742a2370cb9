"""What each release needs: read from a release's sources
(`track/pinning/platform_sources.py`), recorded in the release facts
(`series/platforms.py`), checked by lint and `pin`, and the Installation
page's table written from the record."""

import shutil
import tomllib

import pytest
import tomli_w

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import PINS_FILE, REPO_ROOT
from vllm_overlay.series.facts import FACTS_FILE
from vllm_overlay.series.platforms import Platform, recorded_platforms
from vllm_overlay.track.pinning.platform_sources import (
    platform_in_sources,
    platform_problems,
)
from vllm_overlay.track.pinning.release_facts import settle_new_release_facts
from vllm_overlay.track.records import install_table, readme_table
from vllm_overlay.track.records.generated import generated_files
from vllm_overlay.track.records.install_table import INSTALL_PAGE, render_install_table
from vllm_overlay.track.records.readme_table import README_FILE, with_generated_table

REPO_PATCHES = REPO_ROOT / "patches"

# The lines the readers look for, in the shapes vLLM 0.32.0's sources have
# them (pyproject.toml:34, requirements/cuda.txt:7, requirements/cpu.txt:9-10,
# vllm/envs.py:92), with the neighbours that must not be taken.
SOURCES = {
    "pyproject.toml": '[project]\nname = "vllm"\nrequires-python = ">=3.11,<3.15"\n',
    "requirements/cuda.txt": (
        "-r common.txt\n\n# Dependencies for NVIDIA GPUs\ntorch==2.13.0\n"
        "torchaudio==2.11.0\ntorchvision==0.28.0 # Required for phi3v processor.\n"
    ),
    "requirements/cpu.txt": (
        'torch==2.13.0+cpu; platform_machine == "x86_64" or platform_machine '
        '== "s390x" or platform_machine == "aarch64"\n'
        'torch==2.13.0; platform_system == "Darwin" or platform_machine == '
        '"ppc64le" or platform_machine == "riscv64"\n'
    ),
    "vllm/envs.py": (
        "if TYPE_CHECKING:\n"
        '    VLLM_MAIN_CUDA_VERSION: str = "13.0"\n'
        '    VLLM_TARGET_DEVICE: str = "cuda"\n'
    ),
}
DECIDED = Platform(
    python=">=3.11,<3.15", torch="2.13.0", cpu_torch="2.13.0+cpu", cuda="13.0"
)


def sources(tmp_path, **replaced):
    """A release's unpacked sdist holding `SOURCES`, with `replaced` files
    (keyed by their name's stem) instead."""
    tree = tmp_path / "sdist"
    for name, text in SOURCES.items():
        path = tree / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(replaced.get(path.stem, text))
    return tree


@pytest.fixture
def root(tmp_path):
    """A patches tree with the repository's pins and facts file to edit."""
    patches = tmp_path / "patches"
    (patches / "vllm").mkdir(parents=True)
    shutil.copy(REPO_PATCHES / PINS_FILE, patches / PINS_FILE)
    shutil.copy(REPO_PATCHES / FACTS_FILE, patches / FACTS_FILE)
    return patches


def edit_platform(root, edit):
    data = tomllib.loads((root / FACTS_FILE).read_text())
    edit(data["platform"])
    (root / FACTS_FILE).write_text(tomli_w.dumps(data))


def test_a_releases_sources_decide_its_entry(tmp_path):
    assert platform_in_sources(sources(tmp_path)) == DECIDED
    assert DECIDED.toml_line("0.32.0") == (
        '"0.32.0" = { python = ">=3.11,<3.15", torch = "2.13.0", '
        'cpu_torch = "2.13.0+cpu", cuda = "13.0" }'
    )


@pytest.mark.parametrize(
    ("stem", "text", "message"),
    [
        ("pyproject", '[project]\nname = "vllm"\n', "no project.requires-python"),
        ("cuda", "torch>=2.13\n", r"cuda.txt: no torch== line for every machine"),
        ("cpu", "torch==2.13.0; platform_system == 'Darwin'\n", "cpu.txt: no torch=="),
        (
            "envs",
            "VLLM_MAIN_CUDA_VERSION = None\n",
            "no default VLLM_MAIN_CUDA_VERSION",
        ),
    ],
)
def test_sources_that_do_not_say_are_named(tmp_path, stem, text, message):
    with pytest.raises(OverlayError, match=message):
        platform_in_sources(sources(tmp_path, **{stem: text}))


def test_the_repositorys_record_loads_for_every_pinned_release():
    assert set(recorded_platforms(REPO_PATCHES)) == set(
        tomllib.loads((REPO_PATCHES / PINS_FILE).read_text())["releases"]
    )


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda t: t.update({"9.9.9": t["0.32.0"]}),
            "names 9.9.9, which is not pinned",
        ),
        (lambda t: t["0.32.0"].pop("cuda"), "0.32.0 must set exactly cpu_torch, cuda"),
        (lambda t: t["0.32.0"].update(cuda=13), "each a non-empty string"),
        (lambda t: t["0.32.0"].update(python="3.11+"), "0.32.0: python: Invalid"),
    ],
)
def test_a_bad_record_is_one_line_naming_the_file(root, edit, message):
    edit_platform(root, edit)
    with pytest.raises(OverlayError, match=message) as caught:
        recorded_platforms(root)
    assert str(caught.value).startswith(f"{root / FACTS_FILE}: [platform]")


def test_lint_names_a_missing_or_wrong_entry_with_the_line_to_write(root, tmp_path):
    tree = sources(tmp_path)
    assert platform_problems(root, {"0.32.0": tree}) == []
    edit_platform(root, lambda t: t["0.32.0"].update(torch="2.12.0"))
    (problem,) = platform_problems(root, {"0.32.0": tree})
    assert problem.endswith(
        f"0.32.0 differs from its sources; write {DECIDED.toml_line('0.32.0')}"
    )
    edit_platform(root, lambda t: t.pop("0.32.0"))
    assert platform_problems(root, {}) == [
        f"{root / FACTS_FILE}: [platform] has no entry for 0.32.0"
    ]
    (problem,) = platform_problems(root, {"0.32.0": tree})
    assert problem.endswith(f"no entry for 0.32.0: write {DECIDED.toml_line('0.32.0')}")


def test_pin_writes_the_entry_a_new_release_needs(root, tmp_path, monkeypatch):
    """`pin` (through `settle_new_release_facts`) writes the entry of the
    release it pinned, as the sources it fetched decide, in release order,
    every other line kept, and says so."""
    facts = root / FACTS_FILE
    lines = facts.read_text().splitlines(keepends=True)
    (at,) = [n for n, line in enumerate(lines) if line.startswith('"0.32.0" = {')]
    facts.write_text("".join(lines[:at] + lines[at + 1 :]))
    monkeypatch.setattr(
        "vllm_overlay.track.pinning.release_facts.cached_sdist_tree",
        lambda pin, cache: sources(tmp_path) if pin.version == "0.32.0" else None,
    )

    said = settle_new_release_facts("0.32.0", root, tmp_path / "cache")

    assert facts.read_text().splitlines(keepends=True) == [
        *lines[:at],
        DECIDED.toml_line("0.32.0") + "\n",
        *lines[at + 1 :],
    ]
    assert said[-1] == (
        f"{facts}:{at + 1}: [platform]: as vLLM 0.32.0's sources say, wrote "
        f"{DECIDED.toml_line('0.32.0')}"
    )
    assert settle_new_release_facts("0.32.0", root, tmp_path / "cache")[-1] != said[-1]


def test_the_install_table_says_what_each_pinned_build_needs(root):
    rows = {
        row.split(" | ")[0].removeprefix("| "): row
        for row in render_install_table(root).splitlines()[2:]
    }
    assert rows["0.32.0"] == (
        "| 0.32.0 | `>=3.11,<3.15` | torch 2.13.0, CUDA 13.0 | torch 2.13.0+cpu "
        "| aarch64, x86_64 (glibc 2.28 or newer) |"
    )
    assert "| torch 2.14.0, CUDA 13.0 | (not pinned) |" in rows["0.34.0"]
    edit_platform(root, lambda t: t.pop("0.34.0"))
    assert (
        render_install_table(root)
        .splitlines()[2]
        .startswith("| 0.34.0 | (not recorded) |")
    )


def test_the_installation_pages_table_is_current():
    page = REPO_ROOT / INSTALL_PAGE
    text = page.read_text(encoding="utf-8")
    markers = (install_table.BEGIN, install_table.END)
    assert with_generated_table(
        text, render_install_table(REPO_PATCHES), page, markers
    ) == (text), (
        f"{INSTALL_PAGE}'s table is out of date: run `vllm-overlay table --write`"
    )


def test_a_checkout_with_release_facts_must_hold_the_installation_page(root):
    """`table --write` and `--check` (`generated_files`) write the page's
    table wherever release facts exist, and refuse, naming the page, when
    it or its marker lines are missing."""
    checkout = root.parent
    readme = readme_table.BEGIN, readme_table.END
    (checkout / README_FILE).write_text("# demo\n\n" + "\n".join(readme) + "\n")
    page = checkout / INSTALL_PAGE
    with pytest.raises(OverlayError, match=f"no {page}: its table"):
        generated_files(root, "")
    page.parent.mkdir(parents=True)
    page.write_text("# Installation\n")
    with pytest.raises(OverlayError, match=f"{page} has no generated table to write"):
        generated_files(root, "")
    page.write_text(f"# Installation\n\n{install_table.BEGIN}\n{install_table.END}\n")
    assert generated_files(root, "")[page] == (
        f"# Installation\n\n{install_table.BEGIN}\n{render_install_table(root)}"
        f"{install_table.END}\n"
    )
