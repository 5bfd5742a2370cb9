"""The decode side's receive path, attacked the way routers and busy servers
deliver P/D requests: crafted `kv_transfer_params` sent straight to the
decode server, as a router forwards them (issue 37's rows).

A NIXL read is one-sided: the decode worker reads the prefill server's
blocks, which the prefill server frees once every reader notified it or its
lease (`kv_lease_duration`) ran out. Upstream reads whatever a reference
names, however late: a read of freed blocks returns whatever they hold by
then (HTTP 200, another prompt's output), and on a CPU prefill server that
stopped stepping it is never served (the request hangs). Patched
(`nixl-decode-confirms-reads`), the decode side asks the prefill server
whether it still holds the request's blocks before it schedules the read,
and again once the read completed; it computes the prompt itself when they
are gone.

The patched build runs the rows with plain NixlConnector on the decode side
and with MultiConnector[NixlConnector, LMCacheConnectorV1]. Upstream's rows
(plain NixlConnector: it does not start the other layout for a hybrid) are
printed, never judged, so the suite leaves them out; `python -m ci.suites.pd_e2e
--upstream-receive` adds them (a minute and a half on 2 cores). The probes of
nixl-decode-confirms-reads show upstream's failures on every run.

Each row sends a prompt of its own (drawn under a seed of its own), whose
clean answer the pair gave first through the proxy. Prefix caching is off
on both servers, so every decode request pulls its whole prompt, as the
decode server's cache reset before each row would; the prefill server's
cache is capped, so that a few other prompts reuse freed blocks, and the
lease is short (`LEASE_S` on both servers, heartbeats every second) so that
the rows after it take seconds. The decode server runs one sequence at a
time, so that a request can wait in its queue behind a long one.

The last rows send a reference with one field missing, of the wrong type
or negative, as any client of the decode server's OpenAI endpoint can:
upstream's engine reads them inside its scheduler's step and dies with
every request on it (EngineDeadError). Patched
(`nixl-refuse-malformed-kv-transfer-params`), the decode server refuses
each with HTTP 400 naming the field, then answers the same reference, well
formed, with its clean answer.

On the patched build every row must answer the clean answer within its
bound (a malformed row: HTTP 400 naming its field); then the decode server
serves an ordinary request, both KV caches empty at idle, and the prefill
server logs no read of freed blocks.
"""

import json
import math
import time
import urllib.error
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path

from ci.suites.pd.cases import HYBRID, LMCACHE, Check, multi
from ci.suites.pd.completions import (
    Completion,
    complete,
    completion_body,
    make_prompts,
    parse_completion,
    post,
)
from ci.suites.pd.faults import prefill_only
from ci.suites.pd.load import INVALID_READ, count_lines, idle_usage
from ci.suites.pd.mtp_verdicts import NEAR_TIE, parting
from ci.suites.pd.pair import (
    PATCHED,
    UNPATCHED,
    Layout,
    Pair,
    nixl_with_lease,
    start_pair,
)
from vllm_overlay.common.errors import OverlayError

# kv_lease_duration of both servers: the prefill server keeps a finished
# request's blocks this long unless the decode server's heartbeats (every
# LEASE_S // 6 seconds) renew it; the late rows wait it out and a margin.
LEASE_S = 6
LATE_S = LEASE_S + 2
NIXL_LEASED = nixl_with_lease(LEASE_S)
# The decode-side layouts, by name. The MultiConnector's other child is a
# cache tier that reports only hits it holds: LMCache's connector, which the
# patched build starts for a hybrid and which then has none (upstream does
# not start it). DecodeBenchConnector, the load cases' second child, fills
# any request NIXL does not load with dummy KV by design, so a request the
# decode side computes itself would answer noise there.
LAYOUTS: dict[str, dict[str, object]] = {
    "MultiConnector": multi(NIXL_LEASED, LMCACHE),
    "NixlConnector": NIXL_LEASED,
}
# The prefill server's cache, in blocks of the hybrid (a few requests' worth),
# and the prompts sent to it to make it reuse freed blocks.
PREFILL_CAP_BLOCKS = 24
CHURN_PROMPTS = make_prompts(count=4, prefix=0, seed=71)
# The decode server's one sequence, and the long request that keeps it busy.
DECODE_ARGS = ("--max-num-seqs", "1")
LONG_TOKENS = 1200
# The bound of a row's request: the patched build's longest row waits out the
# long request; upstream's hanging rows are cut shorter, to print them.
ROW_TIMEOUT_S = {PATCHED: 60.0, UNPATCHED: 15.0}
ROW_PROMPTS = make_prompts(count=9, prefix=0, seed=37)
CLEAN = "clean answer"


# Malformed references, each as a router or any client could send it: its
# name, the field a refusal must name, and the change to a real reference.
MALFORMED: tuple[tuple[str, str, dict[str, object]], ...] = (
    ("without remote_request_id", "remote_request_id", {"remote_request_id": None}),
    ("remote_block_ids as text", "remote_block_ids", {"remote_block_ids": "0,1,2"}),
    ("a negative block id", "remote_block_ids", {"remote_block_ids": [[-1]]}),
    ("a negative remote_port", "remote_port", {"remote_port": -1}),
)


@dataclass(frozen=True)
class Row:
    """What one crafted request got, and the field its refusal must name
    (None: the row must answer the clean answer)."""

    name: str
    outcome: str
    refused_field: str | None = None

    @property
    def as_required(self) -> bool:
        if self.refused_field is None:
            return self.outcome.startswith(CLEAN)
        return (
            self.outcome.startswith("HTTP 400:") and self.refused_field in self.outcome
        )


class Rows:
    """The rows of one pair: its prompts' clean answers and the bound."""

    def __init__(self, pair: Pair, model: Path, timeout: float) -> None:
        self.pair = pair
        self.model = model
        self.timeout = timeout
        self.clean = [complete(pair.proxy_port, model, p) for p in ROW_PROMPTS]
        self.rows: list[Row] = []

    def params(self, index: int) -> dict[str, object]:
        return prefill_only(self.pair.prefill_port, self.model, ROW_PROMPTS[index])

    def decode(self, index: int, params: dict[str, object]) -> str:
        """The decode server's answer to prompt `index` with `params`,
        judged against the prompt's clean answer."""
        body = {
            **completion_body(self.model, ROW_PROMPTS[index]),
            "kv_transfer_params": params,
        }
        return judged(
            lambda: post(self.pair.decode_port, "/v1/completions", body, self.timeout),
            self.clean[index],
            self.timeout,
        )

    def add(self, name: str, outcome: str, refused_field: str | None = None) -> None:
        self.rows.append(Row(name, outcome, refused_field))

    def churn(self) -> None:
        """Ordinary requests to the prefill server, which free their blocks
        when they finish: its capped cache reuses the blocks it freed."""
        for prompt in CHURN_PROMPTS:
            body = {**completion_body(self.model, prompt), "max_tokens": 1}
            post(self.pair.prefill_port, "/v1/completions", body)


def judged(
    call: Callable[[], dict[str, object]],
    clean: Completion,
    timeout: float,
    ties: bool = False,
) -> str:
    """`CLEAN` (with `ties`, also an answer that first parts from the clean
    one at a near tie, saying where), "wrong answer", the HTTP error and its
    message, or no answer within `timeout`."""
    try:
        answer = call()
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}: {error_message(exc)}"
    except (OSError, HTTPException):
        return f"no answer within {timeout:.0f}s"
    try:
        got = parse_completion(answer)
    except OverlayError as exc:
        return str(exc)
    if got.token_ids == clean.token_ids:
        return CLEAN
    if ties and len(got.token_ids) == len(clean.token_ids):
        token, gap = parting(clean, got) or (0, math.inf)
        if gap < NEAR_TIE:
            return f"{CLEAN}, up to a near tie at token {token} (gap {gap:.2g})"
    return "wrong answer"


def error_message(exc: urllib.error.HTTPError) -> str:
    body = exc.read().decode(errors="replace")
    try:
        return str(json.loads(body)["error"]["message"])[:160]
    except (ValueError, LookupError, TypeError):
        return body[:160]


def attack(rows: Rows, pool: ThreadPoolExecutor) -> None:
    """Every row, in an order that keeps the lease waits to one."""
    params = rows.params(0)
    unknown = {**params, "remote_request_id": "no-such-request"}
    rows.add("unknown remote_request_id", rows.decode(0, unknown))

    params = rows.params(1)
    blocks = params["remote_block_ids"]
    assert isinstance(blocks, list)
    far = {**params, "remote_block_ids": [[b + 10**6 for b in g] for g in blocks]}
    rows.add("out-of-range remote_block_ids", rows.decode(1, far))

    params = rows.params(2)
    rows.decode(2, params)
    rows.add("the same reference twice, blocks intact", rows.decode(2, params))

    params = rows.params(3)
    rows.decode(3, params)
    rows.churn()
    rows.add(
        "the same reference twice, blocks reused, within the lease",
        rows.decode(3, params),
    )

    params = rows.params(4)
    first, retry = (pool.submit(rows.decode, 4, params) for _ in range(2))
    rows.add("a router's retry while the first try runs", first.result())
    rows.add("... its retry, to the same decode server", retry.result())

    late = [rows.params(i) for i in (5, 6, 7)]
    time.sleep(LATE_S)
    rows.add(
        f"delivered {LATE_S}s late (past the lease), decode idle",
        rows.decode(5, late[0]),
    )
    rows.churn()
    rows.add(f"delivered {LATE_S}s late, blocks reused", rows.decode(6, late[1]))
    long = pool.submit(busy_decode_server, rows)
    time.sleep(1)
    rows.add(
        f"delivered {LATE_S}s late, queued behind a long request",
        rows.decode(7, late[2]),
    )
    long.result()

    params = rows.params(0)
    for name, field, change in MALFORMED:
        malformed = {
            key: value
            for key, value in {**params, **change}.items()
            if value is not None
        }
        rows.add(f"malformed: {name}", rows.decode(0, malformed), refused_field=field)
    rows.add("the same reference, well formed, after them", rows.decode(0, params))


def busy_decode_server(rows: Rows) -> None:
    """A long ordinary request on the decode server, which runs one
    sequence at a time: a request sent meanwhile waits in its queue."""
    body = {
        **completion_body(rows.model, ROW_PROMPTS[8]),
        "max_tokens": LONG_TOKENS,
    }
    post(rows.pair.decode_port, "/v1/completions", body, rows.timeout * 2)


def run_receive_faults(
    layout: Layout, upstream: bool = False
) -> tuple[list[Check], list[str]]:
    """The rows on fresh pairs: the patched build in each of `LAYOUTS`
    (checked) and, if `upstream`, upstream's with plain NixlConnector
    (printed)."""
    checks, printed = [], []
    pairs = [(PATCHED, "MultiConnector"), (PATCHED, "NixlConnector")]
    if upstream:
        pairs.append((UNPATCHED, "NixlConnector"))
    for build, name in pairs:
        label = f"receive, {build}, decode side {name}"
        try:
            rows, after = attacked_pair(layout, build, name)
        except (OSError, HTTPException, OverlayError) as exc:
            if build == PATCHED:
                checks.append(Check(label, False, str(exc)))
            else:
                printed.append(f"  {label}: stopped: {exc}")
            continue
        printed += [f"  {label}: {row.name}: {row.outcome}" for row in rows]
        if build == PATCHED:
            checks += [
                Check(f"{label}: {row.name}", row.as_required, row.outcome)
                for row in rows
            ]
            checks += after
    return checks, printed


def attacked_pair(
    layout: Layout, build: str, name: str
) -> tuple[list[Row], list[Check]]:
    """One fresh pair of `build` with the decode side `name`, attacked, then
    asked what the rows left behind."""
    model = layout.models[HYBRID]
    with ExitStack() as stack:
        pool = stack.enter_context(ThreadPoolExecutor(max_workers=2))
        pair = start_pair(
            stack,
            layout,
            build,
            HYBRID,
            LAYOUTS[name],
            f"receive-{name}",
            prefix_caching=False,
            decode_args=DECODE_ARGS,
            prefill_config=NIXL_LEASED,
            prefill_args=("--num-gpu-blocks-override", str(PREFILL_CAP_BLOCKS)),
        )
        rows = Rows(pair, model, ROW_TIMEOUT_S[build])
        invalid_before = count_lines(pair.prefill.log, INVALID_READ)
        attack(rows, pool)
        after = aftermath(rows, invalid_before, f"receive, {build}, decode side {name}")
        pair.stop()
    return rows.rows, after


def aftermath(rows: Rows, invalid_before: int, label: str) -> list[Check]:
    """The decode server serves on, both KV caches empty at idle, and no
    read of freed blocks in the prefill server's log."""
    pair = rows.pair
    try:
        complete(pair.proxy_port, rows.model, ROW_PROMPTS[8])
        serves = "an ordinary request through the proxy completed"
    except (OSError, HTTPException, OverlayError) as exc:
        serves = f"failed: {exc}"
    busy = idle_usage({"prefill": pair.prefill_port, "decode": pair.decode_port})
    invalid = count_lines(pair.prefill.log, INVALID_READ) - invalid_before
    return [
        Check(
            f"{label}: the decode server serves on",
            not serves.startswith("failed"),
            serves,
        ),
        Check(
            f"{label}: both KV caches empty at idle",
            not busy,
            ", ".join(busy) or "both empty",
        ),
        Check(
            f"{label}: no read of freed blocks",
            invalid == 0,
            f"{invalid} '{INVALID_READ}' in the prefill server's log",
        ),
    ]
