"""A P/D fleet, attacked the way a production one fails (issue 57): several
prefill and decode servers of the hybrid over NIXL, patched and upstream
side by side, crafted `kv_transfer_params` sent straight to a decode server
as a router forwards them.

The fleet: two patched prefill servers (`prefill-a`, `prefill-b`) and an
upstream one (`prefill-upstream`), each with a capped cache
(`ci/suites/pd/receive.py`), so that a few other prompts reuse the blocks
they free; a patched decode server running one sequence at a time
(`decode-queued`), another patched one (`decode-retry`) and an upstream one
(`decode-upstream`). Prefix caching is off everywhere, so every decode
request pulls its whole prompt, and every server holds (prefill side) or
renews (decode side) 15 s leases. The prefill servers share the first core,
the decode servers the second.

The rows, each with a prompt of its own whose clean answer the upstream
decode server computed alone first. In rows 1 and 2 a first try reaches
`decode-queued` while a long request runs there: it is answered "held" on
receipt and waits, its answer not yet taken up by the scheduler, and the
decode server then stalls (SIGSTOP) while the row goes on.

1. A router's retry on a second patched decode server once the stall has
   outlasted the prefill side's promise to the first try: the retry reads
   and releases the blocks, and the prefill server reuses them. The first
   try, resumed, must not read them: its answer is too old, so it asks anew
   and computes its prompt.
2. A rolling upgrade: during the stall, within the promise, the upstream
   decode server reads the same reference and notifies without asking, and
   the prefill server gets other prompts. It must keep the promised blocks
   until the first try read them or the promise ended (`Keeping the blocks
   ...` in its log).
3. Mixed versions: a patched decode server reads from the upstream prefill
   server (whose references carry no `remote_confirms_reads`, so nothing is
   asked), and the upstream decode server from a patched prefill server.
4. Several prefill servers, one silent: `prefill-b` stops answering
   (SIGSTOP) with four references of it waiting on `decode-retry`; each
   decode question to it waits out its 5 s and the request is computed
   locally, while references of `prefill-a` sent after them, asked with
   threads of their own, are all answered before any request to the silent
   one. Then `prefill-b` is killed and one more of its references arrives.
5. Two revisions of the series, where the clone's history holds the previous
   one (`ci/suites/pd/revisions.py`): a prefill and a decode server of it
   join the fleet, and each revision's decode server reads from the other's
   prefill server.

`ci/suites/pd/fleet_run.py` runs the rows and the checks after them. Every
row must answer the clean answer within the patched rows' bound (or
one that first parts from it at a near tie, `ci/suites/pd/mtp_verdicts.py`:
the bfloat16 hybrid computes a prompt pulled over NIXL, or computed in a
batch, otherwise than alone, and its greedy tokens may move there), and
each row's mechanism must have done its part: in row 1 the first try read
nothing (it computed its prompt; a build that used its outlived answer reads
the released blocks, and, on a prefill server that stopped stepping, waits
for a read nobody serves), in row 2 the prefill server kept the promised
blocks, in row 4 the live prefill server's requests were all answered before
any of the silent one's. Then every live server serves an ordinary request,
every live KV cache is empty at idle, and no live prefill server logs a read
of released blocks (upstream's "Potentially invalid KV blocks", logged when a
read's notification names a request whose blocks are gone). One such line is
expected and counted apart: the promised reader's notification for blocks
the prefill server kept (row 2), arriving after the promise ended and the
blocks were freed. The decode side uses such a read without asking again
only if it completed within the promise, by its own clock from its question
(the blocks were held then); otherwise it asks, and computes.
"""

import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from ci.suites.pd.cases import HYBRID, Check
from ci.suites.pd.completions import complete, completion_body, make_prompts, post
from ci.suites.pd.faults import prefill_only
from ci.suites.pd.load import count_lines
from ci.suites.pd.metrics import metric_sum, scrape
from ci.suites.pd.pair import (
    DECODE_CORES,
    HANDSHAKE_PROMPT,
    PATCHED,
    PREFILL_CORES,
    UNPATCHED,
    Layout,
    nixl_with_lease,
    retried,
    start_vllm,
    wait_all,
)
from ci.suites.pd.receive import (
    CHURN_PROMPTS,
    DECODE_ARGS,
    PREFILL_CAP_BLOCKS,
    ROW_TIMEOUT_S,
    Row,
    judged,
)
from ci.suites.servers import Server
from vllm_overlay.common.errors import OverlayError

PREFILL, DECODE = "prefill", "decode"
A, B, UPSTREAM_PREFILL = "prefill-a", "prefill-b", "prefill-upstream"
QUEUED, RETRY, UPSTREAM_DECODE = "decode-queued", "decode-retry", "decode-upstream"


@dataclass(frozen=True)
class Member:
    """A server of a fleet: its name, build, role and `vllm serve` arguments
    of its own."""

    name: str
    build: str
    role: str
    args: tuple[str, ...] = ()


PREFILL_CAP = ("--num-gpu-blocks-override", str(PREFILL_CAP_BLOCKS))
MEMBERS = (
    Member(A, PATCHED, PREFILL, PREFILL_CAP),
    Member(B, PATCHED, PREFILL, PREFILL_CAP),
    Member(UPSTREAM_PREFILL, UNPATCHED, PREFILL, PREFILL_CAP),
    Member(QUEUED, PATCHED, DECODE, DECODE_ARGS),
    Member(RETRY, PATCHED, DECODE),
    Member(UPSTREAM_DECODE, UNPATCHED, DECODE),
)
# The decode servers' first reads from each prefill server the rows use,
# made before any row (a first NIXL handshake on busy cores may take longer
# than the 5 s a decode worker waits for it: `pair.retried`).
HANDSHAKES = (
    (QUEUED, A),
    (RETRY, A),
    (UPSTREAM_DECODE, A),
    (QUEUED, UPSTREAM_PREFILL),
    (RETRY, B),
)
# The prefill side's promise to the decode request it answered "held" (the
# decode side uses such an answer only within 4.75 s of its question): row 1's
# decode server stalls past it before the retry arrives.
PROMISE_S = 5
# Both sides' lease, long enough that the stalled decode server's unrenewed
# lease still holds the blocks when the retry arrives, short enough that a
# reference nobody read is freed well within the idle check's wait.
LEASE_S = 15
NIXL_FLEET = nixl_with_lease(LEASE_S)
# Rows 1 and 2: the long request on `decode-queued`, which runs one sequence
# at a time, so that a first try sent meanwhile waits and the scheduler does
# not look at it (nor take up its answer) until the long request ended. It is
# short enough to end soon after the stall of row 2, within the promise.
BUSY_PROMPT = make_prompts(count=1, prefix=0, length=64, seed=91)[0]
BUSY_TOKENS = 400
# How long the first try's "held" answer is given to come back before its
# decode server stalls.
ANSWER_S = 0.5
# Row 4: references to the silent prefill server in flight, as many as a
# decode server had threads to ask every prefill server with before each got
# a pool of its own (four), then references to the live one; and one more
# reference to the silent server, sent once it was killed.
LIVE_IN_FLIGHT, SILENT_IN_FLIGHT = 3, 4 + 1
PROMPTS = make_prompts(count=4 + LIVE_IN_FLIGHT + SILENT_IN_FLIGHT, prefix=0, seed=57)
# How long a row waits for a decode server's queue to show its request.
QUEUE_WAIT_S = 30
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
# Lines whose count in the logs tells what a row's mechanism did.
KEPT = "Keeping the blocks of request"
REQUEST_ID = re.compile(r"request (\S+)")
COMPUTED_HERE = "Not reading the KV blocks of request"
DECLINED = "Not using the KV read for request"


class Fleet:
    """A started, ready fleet of the hybrid, each decode server's first read
    from each prefill server it will read from made, and the clean answers
    of `prompts`, computed alone by the decode server `oracle`."""

    def __init__(
        self,
        stack: ExitStack,
        layout: Layout,
        members: Sequence[Member] = MEMBERS,
        handshakes: Sequence[tuple[str, str]] = HANDSHAKES,
        prompts: Sequence[Sequence[int]] = PROMPTS,
        oracle: str = UPSTREAM_DECODE,
    ) -> None:
        self.model = layout.models[HYBRID]
        self.prompts = prompts
        self.servers: dict[str, tuple[Server, int]] = {}
        for member in members:
            self.servers[member.name] = start_vllm(
                stack,
                layout,
                member.build,
                HYBRID,
                f"fleet-{member.name}",
                NIXL_FLEET,
                PREFILL_CORES if member.role == PREFILL else DECODE_CORES,
                prefix_caching=False,
                extra_args=member.args,
                confine=True,
            )
        wait_all([(server, port, "/health") for server, port in self.servers.values()])
        for decode, prefill in handshakes:
            self.first_read(decode, prefill)
        self.clean = [complete(self.port(oracle), self.model, p) for p in prompts]
        self.live = {member.name for member in members}

    def port(self, name: str) -> int:
        return self.servers[name][1]

    def server(self, name: str) -> Server:
        return self.servers[name][0]

    def first_read(self, decode: str, prefill: str) -> None:
        def read() -> None:
            params = prefill_only(self.port(prefill), self.model, HANDSHAKE_PROMPT)
            body = {
                **completion_body(self.model, HANDSHAKE_PROMPT),
                "kv_transfer_params": params,
            }
            post(self.port(decode), "/v1/completions", body)

        retried(read, f"{decode}'s first read from {prefill}", self.server(decode).log)

    def prefill(self, name: str, index: int) -> dict[str, object]:
        return prefill_only(self.port(name), self.model, self.prompts[index])

    def decode(self, name: str, index: int, params: dict[str, object]) -> str:
        """What decode server `name` answered prompt `index` with `params`,
        judged against its clean answer."""
        timeout = ROW_TIMEOUT_S[PATCHED]
        body = {
            **completion_body(self.model, self.prompts[index]),
            "kv_transfer_params": params,
        }
        return judged(
            lambda: post(self.port(name), "/v1/completions", body, timeout),
            self.clean[index],
            timeout,
            ties=True,
        )

    def busy(self, name: str) -> None:
        """A long ordinary request on decode server `name`."""
        body = {
            **completion_body(self.model, BUSY_PROMPT),
            "max_tokens": BUSY_TOKENS,
        }
        post(self.port(name), "/v1/completions", body, ROW_TIMEOUT_S[PATCHED] * 2)

    def churn(self, name: str) -> None:
        """Ordinary requests to prefill server `name`, whose capped cache
        then reuses the blocks it freed."""
        for prompt in CHURN_PROMPTS:
            body = {**completion_body(self.model, prompt), "max_tokens": 1}
            post(self.port(name), "/v1/completions", body)

    def wait_for(self, name: str, metric: str, count: int) -> None:
        """Until decode server `name`'s `metric` gauge reaches `count`."""
        deadline = time.monotonic() + QUEUE_WAIT_S
        while metric_sum(scrape(self.port(name)), metric) < count:
            if time.monotonic() > deadline:
                raise OverlayError(f"{name}'s {metric} never reached {count}")
            time.sleep(0.1)

    def lines(self, name: str, text: str) -> int:
        return count_lines(self.server(name).log, text)


def request_ids(log: Path, text: str) -> list[str]:
    """The request each line of `log` with `text` names, in order."""
    return [
        found.group(1)
        for line in log.read_text(errors="replace").splitlines()
        if text in line and (found := REQUEST_ID.search(line)) is not None
    ]


def timed(call: Callable[[], str]) -> tuple[str, float]:
    started = time.monotonic()
    return call(), time.monotonic() - started


class Attack:
    """The rows of one fleet, and the checks of what their mechanisms did."""

    def __init__(self, fleet: Fleet, pool: ThreadPoolExecutor) -> None:
        self.fleet = fleet
        self.pool = pool
        self.rows: list[Row] = []
        self.checks: list[Check] = []

    def add(self, name: str, outcome: str) -> None:
        self.rows.append(Row(name, outcome))

    def while_stalled(
        self,
        index: int,
        params: dict[str, object],
        first_row: str,
        meanwhile: Callable[[], None],
    ) -> None:
        """Prompt `index` sent to `decode-queued` behind a long request: it
        is answered "held" on receipt, in milliseconds, and waits; then the
        decode server stalls (SIGSTOP) while `meanwhile` runs, and resumes.
        The first try's answer is the row `first_row`."""
        fleet = self.fleet
        long = self.pool.submit(fleet.busy, QUEUED)
        fleet.wait_for(QUEUED, RUNNING, 1)
        first = self.pool.submit(fleet.decode, QUEUED, index, params)
        fleet.wait_for(QUEUED, WAITING, 1)
        time.sleep(ANSWER_S)
        fleet.server(QUEUED).pause()
        try:
            meanwhile()
        finally:
            fleet.server(QUEUED).resume()
        self.add(first_row, first.result())
        long.result()

    def retry_while_stalled(self) -> None:
        """Row 1."""
        fleet = self.fleet
        params = fleet.prefill(A, 0)
        computed = fleet.lines(QUEUED, COMPUTED_HERE)
        declined = fleet.lines(QUEUED, DECLINED)

        def retry() -> None:
            time.sleep(PROMISE_S + 1)
            self.add(
                "a retry on another patched decode server, the first try's "
                "server stalled past the promise",
                fleet.decode(RETRY, 0, params),
            )
            fleet.churn(A)

        self.while_stalled(
            0, params, "... the first try, queued on the stalled server", retry
        )
        computed = fleet.lines(QUEUED, COMPUTED_HERE) - computed
        declined = fleet.lines(QUEUED, DECLINED) - declined
        self.checks.append(
            Check(
                f"fleet: {QUEUED} read nothing on its outlived answer",
                (computed, declined) == (1, 0),
                f"computed {computed} prompt(s) without reading, declined "
                f"{declined} read(s) after reading",
            )
        )

    def rolling_upgrade(self) -> None:
        """Row 2."""
        fleet = self.fleet
        params = fleet.prefill(A, 1)
        kept = fleet.lines(A, KEPT)

        def read_without_asking() -> None:
            self.add(
                "the reference read by an upstream decode server meanwhile",
                fleet.decode(UPSTREAM_DECODE, 1, params),
            )
            fleet.churn(A)

        self.while_stalled(
            1,
            params,
            "... the first try, promised, queued on a patched one",
            read_without_asking,
        )
        kept = fleet.lines(A, KEPT) - kept
        self.checks.append(
            Check(
                f"fleet: {A} kept the blocks promised to {QUEUED}",
                kept == 1,
                f"kept {kept} request's blocks another decode server released",
            )
        )

    def mixed_versions(self) -> None:
        """Row 3."""
        fleet = self.fleet
        self.add(
            "a patched decode server reads from an upstream prefill server",
            fleet.decode(QUEUED, 2, fleet.prefill(UPSTREAM_PREFILL, 2)),
        )
        self.add(
            "an upstream decode server reads from a patched prefill server",
            fleet.decode(UPSTREAM_DECODE, 3, fleet.prefill(A, 3)),
        )

    def one_prefill_silent(self) -> None:
        """Row 4."""
        fleet = self.fleet
        live_first = 4
        silent_first = live_first + LIVE_IN_FLIGHT
        live = [fleet.prefill(A, i) for i in range(live_first, silent_first)]
        silent = [fleet.prefill(B, i) for i in range(silent_first, len(PROMPTS))]
        late = silent.pop()
        fleet.server(B).pause()
        silent_calls = [
            self.pool.submit(timed, lambda i=i, p=p: fleet.decode(RETRY, i, p))
            for i, p in enumerate(silent, silent_first)
        ]
        # The live server's references arrive once the silent one's wait.
        fleet.wait_for(RETRY, WAITING, len(silent))
        live_calls = [
            self.pool.submit(timed, lambda i=i, p=p: fleet.decode(RETRY, i, p))
            for i, p in enumerate(live, live_first)
        ]
        live_done = [call.result() for call in live_calls]
        silent_done = [call.result() for call in silent_calls]
        for outcome, _ in live_done:
            self.add(f"a reference to {A} while {B} is silent", outcome)
        for outcome, _ in silent_done:
            self.add(f"a reference to the silent {B}", outcome)
        fleet.server(B).kill()
        fleet.live.discard(B)
        self.add(
            f"a reference to {B} after it was killed",
            fleet.decode(RETRY, len(PROMPTS) - 1, late),
        )
        slowest_live = max(seconds for _, seconds in live_done)
        fastest_silent = min(seconds for _, seconds in silent_done)
        self.checks.append(
            Check(
                f"fleet: {A}'s requests did not wait for the silent {B}'s",
                slowest_live < fastest_silent,
                f"{A}'s in "
                + ", ".join(f"{s:.1f}s" for _, s in live_done)
                + f"; {B}'s in "
                + ", ".join(f"{s:.1f}s" for _, s in silent_done),
            )
        )
