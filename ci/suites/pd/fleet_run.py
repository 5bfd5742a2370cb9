"""A fleet attacked from start to end (`ci/suites/pd/fleet.py`'s rows, with
the two-revision row of `ci/suites/pd/revisions.py` where the layout holds
the previous revision's environment), and what every live server must
still be afterwards."""

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from http.client import HTTPException

from ci.suites.pd import revisions
from ci.suites.pd.cases import Check
from ci.suites.pd.completions import complete, completion_body, post
from ci.suites.pd.fleet import (
    HANDSHAKES,
    KEPT,
    MEMBERS,
    PROMPTS,
    UPSTREAM_PREFILL,
    A,
    Attack,
    Fleet,
    request_ids,
)
from ci.suites.pd.load import INVALID_READ, idle_usage
from ci.suites.pd.pair import Layout
from vllm_overlay.common.errors import OverlayError


def aftermath(fleet: Fleet, invalid_before: dict[str, int]) -> list[Check]:
    """Every live server serves on, every live KV cache empties, and no live
    prefill server read released blocks."""
    checks = []
    for name in sorted(fleet.live):
        try:
            complete(fleet.port(name), fleet.model, fleet.prompts[0])
            serves = "an ordinary request completed"
        except (OSError, HTTPException, OverlayError) as exc:
            serves = f"failed: {exc}"
        checks.append(
            Check(f"fleet: {name} serves on", not serves.startswith("failed"), serves)
        )
    busy = idle_usage({name: fleet.port(name) for name in sorted(fleet.live)})
    checks.append(
        Check(
            "fleet: every live KV cache empty at idle",
            not busy,
            ", ".join(busy) or "all empty",
        )
    )
    for name, before in sorted(invalid_before.items()):
        log = fleet.server(name).log
        invalid = request_ids(log, INVALID_READ)[before:]
        late = [req for req in invalid if req in request_ids(log, KEPT)]
        checks.append(
            Check(
                f"fleet: {name} read no released blocks",
                len(late) == len(invalid),
                f"{len(invalid) - len(late)} '{INVALID_READ}' in its log"
                + (
                    f", and {len(late)} late notification(s) of a kept request"
                    if late
                    else ""
                ),
            )
        )
    return checks


def settled(fleet: Fleet, prefills: Sequence[str]) -> dict[str, int]:
    """Each of `prefills`' count of reads of released blocks in its log once
    the fleet's setup settled. A CPU prefill server takes a read's
    notification up only when it next steps, which an idle one does at its
    next request: a setup read that completed as its lease ran out (a first
    read, with its NIXL handshake, on busy cores) would otherwise be logged
    during the rows and judged with them. An ordinary request to each makes
    it step first."""
    body = {**completion_body(fleet.model, fleet.prompts[0]), "max_tokens": 1}
    for name in prefills:
        post(fleet.port(name), "/v1/completions", body)
    return {n: len(request_ids(fleet.server(n).log, INVALID_READ)) for n in prefills}


def run_fleet_faults(
    layout: Layout, previous: str | None = None
) -> tuple[list[Check], list[str]]:
    """The rows on a fresh fleet, with the two-revision row when `previous`
    names the previous revision whose environment the layout holds (as
    `revisions.PREVIOUS`): the checks, and the lines to print."""
    label = "fleet"
    members, handshakes, prompts = MEMBERS, HANDSHAKES, tuple(PROMPTS)
    live_prefills: tuple[str, ...] = (A, UPSTREAM_PREFILL)
    if previous is not None:
        members += revisions.MEMBERS
        handshakes += revisions.HANDSHAKES
        prompts += tuple(revisions.ROW_PROMPTS)
        live_prefills += (revisions.PREVIOUS_PREFILL,)
    try:
        with ExitStack() as stack:
            pool = stack.enter_context(ThreadPoolExecutor(max_workers=16))
            fleet = Fleet(stack, layout, members, handshakes, prompts)
            invalid_before = settled(fleet, live_prefills)
            attack = Attack(fleet, pool)
            attack.retry_while_stalled()
            attack.rolling_upgrade()
            attack.mixed_versions()
            attack.one_prefill_silent()
            if previous is not None:
                revisions.two_revisions(attack, previous)
            checks = attack.checks + [
                Check(f"{label}: {row.name}", row.as_required, row.outcome)
                for row in attack.rows
            ]
            checks += aftermath(fleet, invalid_before)
            for name in sorted(fleet.live):
                fleet.server(name).stop()
    except (OSError, HTTPException, OverlayError) as exc:
        return [Check(label, False, str(exc))], []
    setup = [
        f"  {label}: before the rows, {name} logged {count} '{INVALID_READ}' for the "
        "setup's first reads (not judged)"
        for name, count in invalid_before.items()
        if count
    ]
    return checks, setup + [
        f"  {label}: {row.name}: {row.outcome}" for row in attack.rows
    ]
