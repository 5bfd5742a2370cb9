"""The `vllm-overlay` command line: what each command does with what
`vllm_overlay.arguments` parsed."""

import argparse
import datetime
import json
import sys
from collections.abc import Callable

from vllm_overlay.arguments import parse
from vllm_overlay.common import atomic
from vllm_overlay.common.errors import OverlayError, exit_status
from vllm_overlay.common.locations import patches_root
from vllm_overlay.series.loader import release_series
from vllm_overlay.series.pins import Dist
from vllm_overlay.track.checks.lint import lint, releases_without_sources
from vllm_overlay.track.pinning.pin import bump_release, pin_release
from vllm_overlay.track.pinning.release_facts import (
    facts_after_pin,
    settle_new_release_facts,
)
from vllm_overlay.track.rebasing.conflicts import format_conflicts
from vllm_overlay.track.rebasing.edit_tree import open_series, refresh_command
from vllm_overlay.track.rebasing.rebase import (
    RebaseOutcome,
    abort_rebase,
    continue_rebase,
    probe_outcome,
    skip_patch,
    start_rebase,
    start_rebase_onto_source,
)
from vllm_overlay.track.rebasing.refresh import refresh
from vllm_overlay.track.rebasing.round_trip import refresh_check
from vllm_overlay.track.records.generated import generated_files
from vllm_overlay.track.records.table import TABLE_FILE, render_table
from vllm_overlay.track.records.verdicts import VERDICTS_FILE
from vllm_overlay.track.status.judging import Verdict
from vllm_overlay.track.status.probing import format_rebased
from vllm_overlay.track.status.status import (
    format_json,
    format_table,
    record_status,
    refuse_unrecordable,
    status,
    status_at,
)
from vllm_overlay.track.status.watch import WATCH_FILE, new_releases
from vllm_overlay.track.upstreaming.extract import extract
from vllm_overlay.track.workspace.git_source import open_git_source
from vllm_overlay.wheel.builder import build_release
from vllm_overlay.wheel.index import LISTING_FILE, SIMPLE_DIR, SUMS_FILE, write_index
from vllm_overlay.wheel.install import carry_out, plan_install
from vllm_overlay.wheel.verify import verify_installed, verify_wheel


def _build(args: argparse.Namespace) -> int:
    series = release_series(args.release)
    if args.release is not None and args.release != series.release.version:
        # `v0.32` and `0.32` name 0.32.0, as every command compares versions.
        print(
            f"vllm-overlay: {args.release} is vLLM {series.release.version}",
            file=sys.stderr,
        )
    print(build_release(series, Dist(args.dist), args.out))
    return 0


def _lint(args: argparse.Namespace) -> int:
    root = patches_root()
    problems = lint(root)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"vllm-overlay lint: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    unchecked = releases_without_sources(root)
    if unchecked:
        # Not a failure: a fresh clone has no sources yet, and CI lints
        # before its per-release steps fetch them (and apply every series).
        print(
            "vllm-overlay lint: no problem found, but zero-fuzz application "
            f"was skipped for vLLM {', '.join(unchecked)}: their sources are "
            "not cached (`tools/test.sh RELEASE` downloads them)"
        )
        return 0
    print("vllm-overlay lint: the series are well-formed")
    return 0


def _pin(args: argparse.Namespace) -> int:
    if args.bump:
        if args.dist:
            raise OverlayError("--bump takes no --dist: it changes no artifact")
        old, pin = bump_release(args.release)
        change = (
            "kept: no commit holds a series under it"
            if old == pin.revision
            else f"{old} -> {pin.revision}"
        )
        print(
            f"vLLM {pin.version}: recorded its series for revision {pin.revision} "
            f"(revision {change})"
        )
        return 0
    pin = pin_release(args.release, [Dist(dist) for dist in args.dist or ()])
    dists = ", ".join(
        f"{dist} ({sum(w.dist == dist for w in pin.wheels)})"
        for dist in dict.fromkeys(w.dist for w in pin.wheels)
    )
    print(f"pinned vLLM {pin.version}: the sdist and wheels of {dists}")
    for line in facts_after_pin(pin):
        print(line)
    return 0


def _table(args: argparse.Namespace) -> int:
    root = patches_root()
    table = render_table(root)
    if not (args.write or args.check):
        print(table, end="")
        return 0
    generated = generated_files(root, table)
    if args.check:
        stale = [
            str(target)
            for target, text in generated.items()
            if not target.is_file() or target.read_text(encoding="utf-8") != text
        ]
        if stale:
            raise OverlayError(
                f"{' and '.join(stale)} out of date; run `vllm-overlay table --write`"
            )
        return 0
    for target, text in generated.items():
        atomic.write_text(target, text)
        print(f"wrote {target}")
    return 0


def _status(args: argparse.Namespace) -> int:
    if args.watch:
        return _watch(args)
    if args.source is not None:
        _refuse_beside(args, "--source", "it checks one git commit")
        rows = status_at(open_git_source(args.source))
    else:
        if args.record:
            refuse_unrecordable(args.releases)
        rows = status(args.releases, probe=args.probe)
    formatted = format_json if args.json else format_table
    print(formatted(rows, probe=args.probe), end="")
    if args.record:
        recorded = record_status(rows)
        releases = ", ".join(recorded.releases) or "no release"
        print(
            f"recorded the verdicts for {releases} "
            f"in {VERDICTS_FILE.name} and {TABLE_FILE}",
            file=sys.stderr,
        )
        if recorded.no_environment:
            raise OverlayError(
                f"kept the recorded verdicts of vLLM "
                f"{', '.join(recorded.no_environment)}: its probes could not run "
                "here (no test environment; run tools/test.sh "
                f"{' '.join(recorded.no_environment)} first)"
            )
        if recorded.inconclusive:
            raise OverlayError(
                "kept the recorded verdicts of "
                f"{'; '.join(recorded.inconclusive)}: their probes failed "
                "outside their assertions or did not run, which proves nothing "
                "about the patch"
            )
    # A conflict is the one verdict a rebase cannot settle alone, so it fails
    # the command (`arguments.STATUS_EXIT`): a script sees it without parsing.
    conflicts = [row for row in rows if row.verdict is Verdict.CONFLICT]
    if conflicts:
        print(
            f"vllm-overlay status: {len(conflicts)} conflict(s): "
            + ", ".join(f"{row.patch} on {row.release}" for row in conflicts),
            file=sys.stderr,
        )
        return 1
    return 0


def _refuse_beside(args: argparse.Namespace, option: str, why: str) -> None:
    """Refuse `status`'s other selections beside `option`, which takes none
    of them (`why`), naming the first one given."""
    given = {
        "RELEASE": args.releases,
        "--source": args.source if option != "--source" else None,
        "--probe": args.probe,
        "--record": args.record,
    }
    refused = [flag for flag, value in given.items() if value]
    if refused:
        raise OverlayError(f"{option} takes no {refused[0]}: {why}")


def _watch(args: argparse.Namespace) -> int:
    """`status --releases`: the release watch (`track.watch`)."""
    _refuse_beside(args, "--releases", "it compares the index with every pin")
    found = new_releases(patches_root())
    today = datetime.date.today()
    if args.json:
        print(json.dumps([release.row(today) for release in found], indent=2))
    else:
        for release in found:
            print(release.line(today))
    pending = [release for release in found if release.skipped is None]
    if pending:
        print(
            f"vllm-overlay status --releases: {len(pending)} newer release(s) "
            "neither pinned nor skipped: pin each (docs/maintainer/releases.md), "
            f"or record it under [skipped] in patches/{WATCH_FILE} with the reason",
            file=sys.stderr,
        )
        return 1
    if not found:
        print("every watched package's newest final release is pinned", file=sys.stderr)
    return 0


def _edit(args: argparse.Namespace) -> int:
    tree = open_series(args.release, args.dir, args.files)
    print(
        f"vllm-overlay edit: the {args.release} series is a git tree at {tree}: "
        f"upstream's files tagged upstream, one commit a patch. Edit or amend "
        f"the commits, then write it back: {refresh_command(args.release, tree)}"
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
    if not outcome.source:
        _report_facts(outcome.to_release)
    return _report_probes(outcome)


def _report_facts(release: str) -> None:
    """The release facts a new pin needs, as its sources (cached by the
    rebase) tell, written where they decide it: what is left is not a
    failure of the rebase, as `lint` fails on it."""
    for line in settle_new_release_facts(release, patches_root()):
        print(f"facts    {line}")


def _report_rebase(outcome: RebaseOutcome) -> None:
    for name in outcome.kept:
        print(f"kept     {name}")
    for dropped in outcome.dropped:
        print(f"dropped  {dropped.patch}: {dropped.reason}")
    # A series written for a pinned release is recorded under its revision;
    # one written into a folder (a rebase onto a git commit) is edited there.
    fix = (
        "fix it by hand"
        if outcome.source
        else "fix it in the patch's message (the text above its `---`), then "
        f"`vllm-overlay pin --bump {outcome.to_release}`"
    )
    for ref in outcome.references:
        if ref.prose:
            print(
                f"prose    {ref.patch}: names {ref.prose}, the series' release: "
                f"{ref.cited!r}; check that it holds on {outcome.to_release}"
            )
        elif ref.changed:
            print(
                f"moved    {ref.patch}: {ref.cited} -> {ref.moved_to}: {ref.changed}, "
                "whose code changed; check what the message says of it"
            )
        elif ref.moved_to:
            print(f"moved    {ref.patch}: {ref.cited} -> {ref.moved_to}")
        else:
            print(f"stale    {ref.patch}: {ref.cited}: {ref.stale}; {fix}")
    if outcome.stopped_at is not None:
        print(f"stopped  {outcome.stopped_at}: merge conflict")
        print(format_conflicts(outcome), end="", file=sys.stderr)
        return
    print(
        f"wrote {outcome.directory} ({len(outcome.kept)} kept, "
        f"{len(outcome.dropped)} dropped)"
    )
    if outcome.changelog:
        print(outcome.changelog)


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


def _index(args: argparse.Namespace) -> int:
    wheels = write_index(args.dist, args.out, args.wheel_url, args.earlier)
    projects = sorted({wheel.project for wheel in wheels})
    where = f"linked at {args.wheel_url}" if args.wheel_url else "copied beside"
    wrote = [args.out / SUMS_FILE]
    if args.wheel_url:
        wrote.append(args.out / LISTING_FILE)
    earlier = f", with the earlier releases' of {args.earlier}" if args.earlier else ""
    print(
        f"wrote {args.out / SIMPLE_DIR} ({len(wheels)} wheel(s) of "
        f"{', '.join(projects)}, {where}{earlier}) and "
        f"{' and '.join(str(path) for path in wrote)}"
    )
    return 0


def _doctor(args: argparse.Namespace) -> int:
    # Imported here: it is the one command that loads vLLM.
    from vllm_overlay.doctor import diagnose

    report = diagnose(
        args.serve_args, with_series=not args.without_series, peer_args=args.peer
    )
    print(report.render(), end="")
    return report.exit_code


def _install(args: argparse.Namespace) -> int:
    plan = plan_install(revert=args.revert)
    installed = f"{plan.installed.dist.value} {plan.installed.version}"
    if plan.done:
        print(f"vllm-overlay: the installed vLLM is {installed} already")
        return 0
    if args.dry_run:
        print(f"vllm-overlay install: {plan.describe()}")
        return 0
    print(f"vllm-overlay: installed {carry_out(plan)} in place of {installed}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    check = verify_installed() if args.installed else verify_wheel(args.wheel)
    built_from = (
        f"its rebuild here from vLLM {check.release}'s {check.dist.value} wheel "
        f"{check.upstream} (sha256 {check.upstream_sha256}, pinned) patched by "
        f"revision {check.revision} of this vllm-overlay's series"
    )
    if check.identical:
        print(f"{check.wheel}: identical to {built_from}")
    else:
        print(f"{check.wheel}: differs from {built_from}:")
        for difference in check.differences or (
            "every member is the same; the archive's own bytes differ (member "
            "order, timestamps or compression)",
        ):
            print(f"  {difference}")
    if check.sha256:
        print(f"sha256 {check.sha256}")
    return 0 if check.identical else 1


# What each command runs (`serve` is run by `main` itself, with everything
# after it handed to vLLM unparsed).
HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "build": _build,
    "doctor": _doctor,
    "status": _status,
    "rebase": _rebase,
    "edit": _edit,
    "refresh": _refresh,
    "pin": _pin,
    "lint": _lint,
    "table": _table,
    "extract": _extract,
    "index": _index,
    "verify": _verify,
    "install": _install,
}


def main(argv: list[str] | None = None) -> int:
    """Every command. The console script (`vllm_overlay.launcher`) runs
    `serve` before this module and all it imports are loaded; here it is
    passed on the same way, to the runtime, with every argument after it."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        from vllm_overlay.runtime.serve import serve

        return serve(argv[1:])
    try:
        return exit_status(lambda: _run(argv))
    except KeyboardInterrupt:
        print("vllm-overlay: interrupted; nothing was written", file=sys.stderr)
        return 130


def _run(argv: list[str]) -> int:
    """Parse `argv` and run its command; a bad argument is an `OverlayError`
    like any other refusal."""
    args = parse(argv)
    return HANDLERS[args.command](args)
