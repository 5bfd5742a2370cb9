"""The release facts a newly pinned release needs, as its sources tell:
`pin` fetches them into the cache (the rebase and the suite read them next)
and settles what they decide, saying what is left; `rebase` does the same
once it has run.

`upstream_tests` entries name the first pinned release that has each of
upstream's test files (`series/facts.py`), so pinning a release older than
some `since` can make that `since` wrong; only the new release's sources
tell which.
"""

from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import PINS_FILE, cache_root, patches_root
from vllm_overlay.doctor.installed_sources import forced_sd_check_in
from vllm_overlay.series.facts import (
    FACTS_FILE,
    environment_facts,
    forced_sd_checks,
    since_findings,
    upstream_tests,
    write_since,
)
from vllm_overlay.series.pins import ReleasePin, load_pins
from vllm_overlay.series.platforms import records_platforms
from vllm_overlay.track.pinning.platform_sources import record_platform
from vllm_overlay.upstream.fetch import cached_sdist_tree, fetch_sdist_tree
from vllm_overlay.upstream.requirements import requirement_lines

CPU_PLATFORM_FILE = "vllm/platforms/cpu.py"


def facts_after_pin(
    pin: ReleasePin, root: Path | None = None, cache: Path | None = None
) -> list[str]:
    """What the release facts need for the newly pinned release `pin`: its
    sources fetched into the cache, `settle_new_release_facts`' lines (the
    NIXL it pins, the conv state layout its CPU platform forces, the
    `upstream_tests` entries it decides, with the evidence for each). When
    the sources cannot be fetched, that, and the entries pinning may have
    made wrong (`_later_since_lines`)."""
    root = root or patches_root()
    if not (root / FACTS_FILE).is_file():
        return []
    try:
        fetch_sdist_tree(pin, cache or cache_root())
    except OverlayError as exc:
        return [
            f"not checked against vLLM {pin.version}'s sources, which could not "
            f"be fetched: {exc}",
            *_later_since_lines(pin.version, root),
        ]
    return settle_new_release_facts(pin.version, root, cache)


def _later_since_lines(version: str, root: Path) -> list[str]:
    """Lines naming the `upstream_tests` entries of the release facts whose
    `since` is later than the newly pinned `version`, or none.

    `since` names the first pinned release that has a file, so pinning an
    older release can make any of these wrong: those files the new release
    has must now name it. Which ones it has is known only from its sources;
    `settle_new_release_facts` writes them once they are cached.
    """
    try:
        later = [
            test
            for test in upstream_tests(root)
            if Version(test.since) > Version(version)
        ]
    except OverlayError as exc:
        return [f"the release facts were not checked against vLLM {version}: {exc}"]
    if not later:
        return []
    return [
        f"patches/{FACTS_FILE.as_posix()}: the harness does not run these "
        f"upstream_tests entries on {version}, whose `since` is later:",
        *(f"  {test}" for test in later),
        f'`vllm-overlay pin` or `rebase FROM {version}` writes since = "{version}" '
        f"into each one whose file vLLM {version}'s sources have, once it can "
        "fetch them; `vllm-overlay lint` checks them once they are cached",
    ]


def settle_new_release_facts(
    version: str, patches_root: Path, cache: Path | None = None
) -> list[str]:
    """Settle what the release facts need for a newly pinned `version`, as
    its cached sources tell (`pin` fetched them; a rebase onto it has just
    read them): lines saying what was done and what is left.

    Of the problems `facts.since_findings` finds with those sources and not
    without them, the one the sources decide (an older pin whose sources
    have an entry's file: its `since` becomes `version`) is written into the
    facts file, and said; any other (an entry whose file the new release
    lacks: removed upstream, or renamed) is named for the maintainer, as
    `lint` names it. Else a line saying the facts fit, or that the sources
    are not cached. Nothing for a checkout without a facts file. What does
    not turn on `version` is `lint`'s to report."""
    if not (patches_root / FACTS_FILE).is_file():
        return []
    cache = cache or cache_root()
    pins = load_pins(patches_root / PINS_FILE)
    sources = {
        release: tree
        for release, pin in pins.items()
        if (tree := cached_sdist_tree(pin, cache)) is not None
    }
    if version not in sources:
        return [
            f"not checked: vLLM {version}'s sources are not cached; "
            f"`vllm-overlay lint` checks them after `tools/test.sh {version}`"
        ]
    tree = sources[version]
    return [
        *_settle_since(version, patches_root, sources),
        *nixl_pin_line(version, tree, patches_root),
        *forced_sd_line(version, tree, patches_root),
        *_platform_line(version, tree, patches_root),
    ]


def _platform_line(version: str, tree: Path, patches_root: Path) -> list[str]:
    """`version`'s `[platform]` entry written as its sources decide (the
    Installation page's table is written from it) and said, or a line when
    the recorded one differs; nothing where the facts record no platforms."""
    if not records_platforms(patches_root):
        return []
    return record_platform(patches_root, version, tree)


def forced_sd_line(version: str, tree: Path, patches_root: Path) -> list[str]:
    """A line when the check after which `version`'s CPU platform forces the
    SD conv state layout (its sources' vllm/platforms/cpu.py) is not the one
    `[forced_sd_check]` records for it: the evidence, for the maintainer to
    read and record (the runtime tests hold doctor to the record)."""
    platform = tree / CPU_PLATFORM_FILE
    found = (
        forced_sd_check_in(platform.read_text(encoding="utf-8"))
        if platform.is_file()
        else None
    )
    try:
        recorded = forced_sd_checks(patches_root).get(version)
    except OverlayError as exc:
        return [str(exc)]
    if (found and found[0]) == recorded:
        return []
    table = f"[forced_sd_check] in patches/{FACTS_FILE.as_posix()}"
    if found is None:
        return [
            f"{table} records {recorded} for {version}, whose "
            f"{CPU_PLATFORM_FILE} forces no conv state layout: remove it"
        ]
    check, line = found
    return [
        f"vLLM {version}'s {CPU_PLATFORM_FILE}:{line} sets the conv state layout "
        f"SD after torch.cpu.{check}() whatever the user set: read it, and record "
        f'"{version}" = "{check}" under {table}'
    ]


def nixl_pin_line(version: str, tree: Path, patches_root: Path) -> list[str]:
    """A line naming the NIXL `version` pins (its sources'
    requirements/kv_connectors*.txt) beside the NIXL its test environment
    takes (`[test_env.nixl]`), for the maintainer to decide; none when the
    release pins no NIXL. A new release's NIXL pin has changed its
    connector's minimum before (0.33.0 refused 1.4.1), and `pin` asks
    nothing of it."""
    pinned = release_nixl_pin(tree)
    if pinned is None:
        return []
    where, requirement = pinned
    try:
        taken = environment_facts(patches_root).nixl.get(version)
    except OverlayError as exc:
        return [f"vLLM {version} pins {requirement} ({where}); not compared: {exc}"]
    facts = f"patches/{FACTS_FILE.as_posix()}"
    if taken is None:
        return [
            f"vLLM {version} pins {requirement} ({where}); its test environment "
            f"takes the default NIXL (ci/envs/nixl-requirements.txt): name a "
            f"hash-pinned file under [test_env.nixl] in {facts} if {version} "
            "refuses that NIXL"
        ]
    return [
        f"vLLM {version} pins {requirement} ({where}); its test environment "
        f"takes {taken} ([test_env.nixl] in {facts})"
    ]


def release_nixl_pin(tree: Path) -> tuple[str, str] | None:
    """Where a release's sources pin `nixl`, and the requirement: the first
    `nixl` line of its requirements/kv_connectors*.txt (the meta package;
    0.34.0 has the same pin in both files)."""
    for path in sorted((tree / "requirements").glob("kv_connectors*.txt")):
        for number, requirement in requirement_lines(path.read_text()):
            if canonicalize_name(requirement.name) == "nixl":
                return f"{path.relative_to(tree)}:{number}", str(requirement)
    return None


def _settle_since(
    version: str, patches_root: Path, sources: dict[str, Path]
) -> list[str]:
    """`settle_new_release_facts`' `upstream_tests` part, with every
    pinned release's cached sources."""
    without = {release: tree for release, tree in sources.items() if release != version}
    try:
        known = {p.line(patches_root) for p in since_findings(patches_root, without)}
        needed = [
            p
            for p in since_findings(patches_root, sources)
            if p.line(patches_root) not in known
        ]
    except OverlayError as exc:
        return [str(exc)]
    lines, left = [], []
    for problem in needed:
        if problem.settled_since != version:
            left.append(problem.line(patches_root))
            continue
        try:
            write_since(patches_root, problem.test, version)
        except OverlayError as exc:
            # Said with what was written before it, which stays written.
            return [*lines, str(exc)]
        lines.append(
            f"{patches_root / FACTS_FILE}: {problem.test}: vLLM {version}'s "
            f'sources have it: wrote since = "{version}"'
        )
    if not needed:
        return [f"the release facts' upstream_tests fit vLLM {version}'s sources"]
    if left:
        lines += [
            *left,
            f"vLLM {version} needs these in the release facts before committing; "
            "`vllm-overlay lint` fails until then",
        ]
    return lines
