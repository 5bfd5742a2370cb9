"""The `vllm-overlay` command line."""

import argparse
import sys
from pathlib import Path

from vllm_overlay import atomic
from vllm_overlay.errors import OverlayError, exit_status
from vllm_overlay.locations import patches_root
from vllm_overlay.series.loader import release_series
from vllm_overlay.series.pins import Dist
from vllm_overlay.track.extract import extract
from vllm_overlay.track.git_source import open_git_source
from vllm_overlay.track.lint import lint
from vllm_overlay.track.pin import bump_release, pin_release
from vllm_overlay.track.probing import format_rebased
from vllm_overlay.track.rebase import (
    RebaseOutcome,
    abort_rebase,
    continue_rebase,
    format_conflicts,
    probe_outcome,
    skip_patch,
    start_rebase,
    start_rebase_onto_source,
)
from vllm_overlay.track.refresh import refresh
from vllm_overlay.track.round_trip import refresh_check
from vllm_overlay.track.status import (
    format_json,
    format_table,
    record_status,
    refuse_unrecordable,
    status,
    status_at,
)
from vllm_overlay.track.table import TABLE_FILE, render_table
from vllm_overlay.wheel.builder import build_release


def _build(args: argparse.Namespace) -> int:
    wheel = build_release(release_series(args.release), args.dist, args.out)
    print(wheel)
    return 0


def _lint(args: argparse.Namespace) -> int:
    problems = lint(patches_root())
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"vllm-overlay lint: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("vllm-overlay lint: the series are well-formed")
    return 0


def _pin(args: argparse.Namespace) -> int:
    if args.bump:
        if args.dist:
            raise OverlayError("--bump takes no --dist: it changes no artifact")
        old, pin = bump_release(args.release)
        change = "kept" if old == pin.revision else f"{old} -> {pin.revision}"
        print(
            f"vLLM {pin.version}: recorded its series for revision {pin.revision} "
            f"(revision {change})"
        )
        return 0
    pin = pin_release(args.release, args.dist or ())
    dists = ", ".join(
        f"{dist} ({sum(w.dist == dist for w in pin.wheels)})"
        for dist in dict.fromkeys(w.dist for w in pin.wheels)
    )
    print(f"pinned vLLM {pin.version}: the sdist and wheels of {dists}")
    return 0


def _table(args: argparse.Namespace) -> int:
    root = patches_root()
    table = render_table(root)
    target = root.parent / TABLE_FILE
    if args.write:
        atomic.write_text(target, table)
        print(f"wrote {target}")
        return 0
    if args.check:
        current = target.read_text(encoding="utf-8") if target.is_file() else ""
        if current != table:
            raise OverlayError(
                f"{target} is out of date; run `vllm-overlay table --write`"
            )
        return 0
    print(table, end="")
    return 0


def _status(args: argparse.Namespace) -> int:
    if args.source is not None:
        given = {
            "RELEASE": args.releases,
            "--probe": args.probe,
            "--record": args.record,
        }
        refused = [flag for flag, value in given.items() if value]
        if refused:
            raise OverlayError(
                f"--source takes no {refused[0]}: it checks one git commit"
            )
        rows = status_at(open_git_source(args.source))
    else:
        if args.record:
            refuse_unrecordable(args.releases)
        rows = status(args.releases, probe=args.probe)
    formatted = format_json if args.json else format_table
    print(formatted(rows, probe=args.probe), end="")
    if args.record:
        recorded = record_status(rows)
        print(
            f"recorded the verdicts for {', '.join(recorded) or 'no patch'} "
            f"in {TABLE_FILE}",
            file=sys.stderr,
        )
    return 0


def _refresh(args: argparse.Namespace) -> int:
    if args.check:
        differ = refresh_check(args.release)
        for name in differ:
            print(f"differs from what refresh writes: {name}", file=sys.stderr)
        if differ:
            raise OverlayError(
                f"the {args.release} series is not what `vllm-overlay refresh` writes"
            )
        print(f"vllm-overlay refresh: the {args.release} series round-trips exactly")
        return 0
    if args.repo is None or args.base is None:
        raise OverlayError("refresh needs --repo PATH and --base REF, or --check")
    directory, changed = refresh(args.release, args.repo, args.base)
    print(f"wrote {directory} ({', '.join(changed) or 'no changes'})")
    return 0


def _rebase(args: argparse.Namespace) -> int:
    resuming = args.resume or args.skip or args.abort
    if resuming and args.releases:
        raise OverlayError("--continue, --skip and --abort take no releases")
    if args.abort:
        print(f"vllm-overlay rebase: abandoned the rebase {abort_rebase()}")
        return 0
    onto_source = args.source is not None or args.out is not None
    if resuming and onto_source:
        raise OverlayError("--continue, --skip and --abort take no --source or --out")
    if onto_source and (args.source is None or args.out is None):
        raise OverlayError("rebase onto a git commit needs both --source and --out")
    wanted = 1 if onto_source else 2
    if not resuming and len(args.releases) != wanted:
        raise OverlayError(
            "rebase --source needs FROM only"
            if onto_source
            else "rebase needs FROM and TO (or --continue/--skip/--abort)"
        )
    if args.skip:
        outcome = skip_patch()
    elif args.resume:
        outcome = continue_rebase()
    elif onto_source:
        outcome = start_rebase_onto_source(args.releases[0], args.source, args.out)
    else:
        outcome = start_rebase(*args.releases)
    _report_rebase(outcome)
    if outcome.stopped_at is not None:
        return 1
    return _report_probes(outcome)


def _report_rebase(outcome: RebaseOutcome) -> None:
    for name in outcome.kept:
        print(f"kept     {name}")
    for dropped in outcome.dropped:
        print(f"dropped  {dropped.patch}: {dropped.reason}")
    for ref in outcome.references:
        if ref.moved_to:
            print(f"moved    {ref.patch}: {ref.cited} -> {ref.moved_to}")
        else:
            print(f"stale    {ref.patch}: {ref.cited}: {ref.stale}; fix it by hand")
    if outcome.stopped_at is not None:
        print(f"stopped  {outcome.stopped_at}: merge conflict")
        print(format_conflicts(outcome), end="", file=sys.stderr)
        return
    print(
        f"wrote {outcome.directory} ({len(outcome.kept)} kept, "
        f"{len(outcome.dropped)} dropped)"
    )


def _report_probes(outcome: RebaseOutcome) -> int:
    """The probes of both series on the rebased release; a probe that does not
    pass fails the command, though the series stays written for review."""
    if outcome.source:
        print(
            "probes   not run: a git commit has no test environment (pin the "
            "release and rebase onto it, or run them by hand)"
        )
        return 0
    probes = probe_outcome(outcome)
    for line in format_rebased(probes):
        print(line)
    if probes.failing:
        raise OverlayError(
            f"{len(probes.failing)} probe(s) do not pass on "
            f"vLLM {outcome.to_release} patched by the new series (written to "
            f"{outcome.directory} for review); fix the series before committing it"
        )
    return 0


def _extract(args: argparse.Namespace) -> int:
    done = extract(args.patch, args.base, args.repo, args.out)
    print(f"wrote {done.directory} (the PR description and the mbox)")
    if done.prerequisites:
        print(
            f"stacked on {', '.join(done.prerequisites)}: it applies to pristine "
            "vLLM only after them, so they come first, one commit each"
        )
    if done.branch is not None:
        print(f"created branch {done.branch} in {args.repo}")
    for tests in done.tests:
        print(f"new upstream tests: {tests.package}/")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    # Imported here: it is the one command that loads vLLM.
    from vllm_overlay.doctor import diagnose

    report = diagnose(args.serve_args, with_series=not args.without_series)
    print(report.render(), end="")
    return report.exit_code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-overlay",
        description="Patch series over pinned vLLM releases for hybrid models "
        "with external KV caches.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser(
        "build", help="build the patched wheel of a pinned release"
    )
    build.add_argument(
        "release", nargs="?", help="pinned vLLM release (default: the newest)"
    )
    build.add_argument(
        "--dist",
        type=Dist,
        choices=list(Dist),
        default=Dist.VLLM,
        help="upstream distribution to patch (default: vllm)",
    )
    build.add_argument(
        "--out", type=Path, default=Path("dist"), help="output directory (dist)"
    )
    build.set_defaults(func=_build)
    pin = commands.add_parser(
        "pin",
        help="pin a release's sdist and wheels, with sha256, in releases.toml "
        "(--bump: record a changed series under a new revision)",
    )
    pin.add_argument("release", help="the vLLM release")
    pin.add_argument(
        "--dist",
        action="append",
        type=Dist,
        choices=list(Dist),
        help="a distribution whose wheels to pin, repeatable (default: every "
        "known one that has wheels)",
    )
    pin.add_argument(
        "--bump",
        action="store_true",
        help="record the release's current series next to its revision, "
        "incrementing the revision when the recorded series changed",
    )
    pin.set_defaults(func=_pin)
    check = commands.add_parser(
        "lint", help="check pins, series files, patch trailers and probe ids"
    )
    check.set_defaults(func=_lint)
    table = commands.add_parser(
        "table", help=f"print the generated {TABLE_FILE} (or --write / --check it)"
    )
    mode = table.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"rewrite {TABLE_FILE}")
    mode.add_argument(
        "--check", action="store_true", help=f"fail if {TABLE_FILE} is out of date"
    )
    table.set_defaults(func=_table)
    upstream = commands.add_parser(
        "status",
        help="how each patch of the nearest series fares against vLLM releases",
    )
    upstream.add_argument(
        "releases",
        nargs="*",
        metavar="RELEASE",
        help="vLLM releases, pinned or not (default: every pinned release)",
    )
    upstream.add_argument(
        "--source",
        metavar="PATH[@REF]",
        help="check a vLLM git clone at REF (default HEAD) instead of releases",
    )
    upstream.add_argument("--json", action="store_true", help="print JSON rows")
    upstream.add_argument(
        "--probe",
        action="store_true",
        help="also run each patch's probes on the unpatched release, in its "
        "cached test environment (still needed / upstream-equivalent)",
    )
    upstream.add_argument(
        "--record",
        action="store_true",
        help=f"keep each pinned release's verdicts for the {TABLE_FILE} column "
        "'Last status' and regenerate it",
    )
    upstream.set_defaults(func=_status)
    refresh_cmd = commands.add_parser(
        "refresh", help="re-export a release's series from a patched git tree"
    )
    refresh_cmd.add_argument("release", help="pinned vLLM release")
    refresh_cmd.add_argument(
        "--repo",
        type=Path,
        help="git work tree: upstream files plus one commit a patch",
    )
    refresh_cmd.add_argument("--base", help="the commit of the pristine files")
    refresh_cmd.add_argument(
        "--check",
        action="store_true",
        help="fail if the series is not what a refresh of itself writes",
    )
    refresh_cmd.set_defaults(func=_refresh)
    # Only listed here: `vllm_overlay.launcher` runs `serve` before this
    # module is imported, handing every argument after it to vLLM.
    commands.add_parser(
        "serve",
        add_help=False,
        help="`vllm serve ARGS...` with the series for the installed vLLM "
        "active in every vLLM process (nothing is installed)",
    )
    rebase_cmd = commands.add_parser(
        "rebase",
        help="replay a release's series onto another pinned release (3-way)",
    )
    rebase_cmd.add_argument(
        "releases", nargs="*", metavar="FROM TO", help="the two pinned releases"
    )
    rebase_cmd.add_argument(
        "--source",
        metavar="PATH[@REF]",
        help="replay FROM onto a vLLM git clone at REF (default HEAD) instead of "
        "a release; the series goes to --out, nothing is pinned",
    )
    rebase_cmd.add_argument(
        "--out", type=Path, metavar="DIR", help="with --source: the new directory"
    )
    step = rebase_cmd.add_mutually_exclusive_group()
    step.add_argument(
        "--continue",
        dest="resume",
        action="store_true",
        help="go on after resolving the conflict of the stopped patch",
    )
    step.add_argument(
        "--skip", action="store_true", help="drop the stopped patch and go on"
    )
    step.add_argument(
        "--abort", action="store_true", help="give the rebase up; nothing is written"
    )
    rebase_cmd.set_defaults(func=_rebase)
    extract_cmd = commands.add_parser(
        "extract", help="turn one patch into an upstream-ready contribution"
    )
    extract_cmd.add_argument("patch", help="patch file name (with or without .patch)")
    extract_cmd.add_argument(
        "--base", help="pinned release whose series holds it (default: the newest)"
    )
    extract_cmd.add_argument(
        "--repo",
        type=Path,
        help="a vLLM git checkout: apply the contribution there on a new branch",
    )
    extract_cmd.add_argument(
        "--out",
        type=Path,
        default=Path("extract"),
        help="where the PR description and the mbox go (default: extract/)",
    )
    extract_cmd.set_defaults(func=_extract)
    doctor = commands.add_parser(
        "doctor",
        help="say which `vllm serve` flags fail or silently degrade for hybrid "
        "models with KV connectors, without starting vLLM",
        usage="vllm-overlay doctor [--without-series] [--] [MODEL] [SERVE FLAGS...]",
    )
    doctor.add_argument(
        "--without-series",
        action="store_true",
        help="judge plain `vllm serve` of an unpatched build (default: as "
        "`vllm-overlay serve` runs it, with the series applied)",
    )
    doctor.add_argument(
        "serve_args",
        nargs=argparse.REMAINDER,
        help="the arguments of `vllm serve` (a first flag needs `--` before it)",
    )
    doctor.set_defaults(func=_doctor)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Every command. The console script (`vllm_overlay.launcher`) runs
    `serve` before this module and all it imports are loaded; here it is
    passed on the same way, to the runtime, with every argument after it."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        from vllm_overlay.runtime.serve import serve

        return serve(argv[1:])
    args = _parser().parse_args(argv)
    try:
        return exit_status(lambda: args.func(args))
    except KeyboardInterrupt:
        print("vllm-overlay: interrupted; nothing was written", file=sys.stderr)
        return 130
