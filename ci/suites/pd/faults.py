"""Faults a P/D deployment meets, on the patched build in the layout its P/D
patch is for (case `hybrid-multi`): nothing may hang, and the decode server
must go on serving.

1. A decode request whose `kv_transfer_params` name a dead address (the
   prefill's own answer with an engine id the decode server never met and
   `remote_port` pointing where nothing listens):
   the decode server answers within the request bound, with the completion
   (recomputed) or an HTTP error that says what failed.
2. The prefill server killed after it prefilled a prompt and before the
   decode server pulled it: the same.
3. Then the decode server still answers an ordinary request, and the proxy,
   whose prefill server is gone, fails the request with an HTTP error
   instead of hanging.

And under load, against the capped decode cache of the case's load run:

4. A dozen streamed requests through the proxy at once, a third of whose
   clients disconnect after their first token: the others complete, and
   both servers free every block once idle (the prefill side's when its
   lease expires, if the decode side never read them).
5. The prefill server killed while streamed requests are in flight through
   the proxy (case 2 happens at the same moment): every one of them ends
   within the request bound, completed or with an error, the decode
   server's KV cache empties, and it serves on (case 3).

The receive paths (late, retried, unknown references) have pairs of their
own: `ci/suites/pd/receive.py`.

With vLLM's default `kv_load_failure_policy` ("fail", config/kv_transfer.py
in 0.32.0) a failed pull ends the request with an error; NIXL gives up a
handshake after VLLM_P2P_HANDSHAKE_TIMEOUT_S (30 s by default, envs.py:238).
"""

import time
import urllib.error
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from http.client import HTTPException
from pathlib import Path

from ci.suites.pd.cases import CASE_BY_KEY, Check
from ci.suites.pd.completions import (
    MAX_TOKENS,
    REQUEST_TIMEOUT_S,
    HTTPStatusError,
    complete,
    completion_body,
    make_prompts,
    parse_completion,
    post,
    streamed_tokens,
)
from ci.suites.pd.load import IDLE_TIMEOUT_S, idle_usage
from ci.suites.pd.pair import PATCHED, Layout, Pair, start_pair
from ci.suites.servers import free_port
from vllm_overlay.common.errors import OverlayError

CASE = CASE_BY_KEY["hybrid-multi"]
# Requests in flight in the cases under load, every ABORT_EVERY-th of whose
# clients disconnects after its first token (case 4); drawn under a seed of
# their own, sharing a prefix with each other and nothing with the suite.
IN_FLIGHT = 12
ABORT_EVERY = 3
LOAD_PROMPTS = make_prompts(count=IN_FLIGHT, seed=24)
# How long case 5 waits for a first token before it kills the prefill
# server anyway.
FIRST_TOKEN_WAIT_S = 60
# What the toy proxy sends the prefill server (toy_proxy_server.py:157-164).
PREFILL_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def prefill_only(port: int, model: Path, prompt: Sequence[int]) -> dict[str, object]:
    """Prefill `prompt` on the prefill server as the proxy does; the
    `kv_transfer_params` a decode server needs to pull it."""
    body = {**completion_body(model, prompt), "max_tokens": 1}
    answer = post(
        port, "/v1/completions", {**body, "kv_transfer_params": PREFILL_PARAMS}
    )
    params = answer.get("kv_transfer_params")
    if not isinstance(params, dict) or not params.get("remote_block_ids"):
        raise OverlayError(f"the prefill server gave no kv_transfer_params: {answer}")
    return params


def outcome(call: Callable[[], dict[str, object]]) -> tuple[bool, str]:
    """Whether `call` came back within the request bound, and what it gave:
    a full completion or an HTTP error with its message."""
    started = time.monotonic()
    try:
        answer = call()
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")[:200]
        return True, f"HTTP {exc.code} after {time.monotonic() - started:.0f}s: {body}"
    except (OSError, HTTPException) as exc:
        return False, f"no answer after {time.monotonic() - started:.0f}s ({exc})"
    try:
        tokens = len(parse_completion(answer).token_ids)
    except OverlayError as exc:
        return False, str(exc)
    ok = tokens == MAX_TOKENS
    return ok, f"{tokens} tokens after {time.monotonic() - started:.0f}s"


def decode_with(
    port: int, model: Path, prompt: Sequence[int], params: dict[str, object]
):
    body = {**completion_body(model, prompt), "kv_transfer_params": params}
    return lambda: post(port, "/v1/completions", body)


def plain(
    port: int, model: Path, prompt: Sequence[int]
) -> Callable[[], dict[str, object]]:
    """An ordinary completion request to `port`, for `outcome`."""
    return lambda: post(port, "/v1/completions", completion_body(model, prompt))


class FirstToken:
    """Set once any streamed request of a batch has its first token."""

    def __init__(self) -> None:
        self.at: float | None = None

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.at is None and time.monotonic() < deadline:
            time.sleep(0.2)


def stream(
    port: int, model: Path, prompt: Sequence[int], abort: bool, first: FirstToken
) -> str:
    """One streamed completion through 127.0.0.1:`port`, read until its end,
    or until its first token if `abort` (then the client disconnects): what
    became of it, starting with "completed", "aborted" or "failed"."""
    body = {**completion_body(model, prompt), "stream": True}
    tokens = 0
    chunks = streamed_tokens(port, body)
    try:
        for chunk in chunks:
            tokens += len(chunk)
            if tokens and first.at is None:
                first.at = time.monotonic()
            if tokens and abort:
                return "aborted"
    except HTTPStatusError as exc:
        return f"failed: {exc}"
    except (OSError, HTTPException, ValueError, LookupError) as exc:
        return f"failed after {tokens} tokens: {type(exc).__name__} {exc}"
    finally:
        chunks.close()
    if tokens == MAX_TOKENS:
        return "completed"
    return f"failed: ended after {tokens} tokens"


def start_streams(
    pool: ThreadPoolExecutor, pair: Pair, model: Path, abort_every: int
) -> tuple[list[Future[str]], FirstToken]:
    """LOAD_PROMPTS streamed through the proxy at once; every `abort_every`
    -th client disconnects after its first token (none if 0)."""
    first = FirstToken()
    futures = [
        pool.submit(
            stream,
            pair.proxy_port,
            model,
            prompt,
            bool(abort_every) and i % abort_every == abort_every - 1,
            first,
        )
        for i, prompt in enumerate(LOAD_PROMPTS)
    ]
    return futures, first


def outcomes(futures: Sequence[Future[str]]) -> list[str]:
    """What became of each streamed request; one that has not ended within
    the request bound (and a margin) is "hung"."""
    deadline = time.monotonic() + REQUEST_TIMEOUT_S + 30
    ended = []
    for future in futures:
        try:
            ended.append(future.result(timeout=max(0.0, deadline - time.monotonic())))
        except TimeoutError:
            ended.append("hung")
    return ended


def tally(ended: Sequence[str]) -> str:
    kinds: dict[str, int] = {}
    for outcome_ in ended:
        kind = outcome_.split(":")[0].split(" after")[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    failures = sorted({e for e in ended if e.startswith("failed")})[:2]
    summary = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
    return summary + (f" ({'; '.join(failures)})" if failures else "")


def aborts_under_load(pool: ThreadPoolExecutor, pair: Pair, model: Path) -> Check:
    """Case 4."""
    futures, _ = start_streams(pool, pair, model, ABORT_EVERY)
    ended = outcomes(futures)
    busy = idle_usage({"prefill": pair.prefill_port, "decode": pair.decode_port})
    expected = [
        "aborted" if i % ABORT_EVERY == ABORT_EVERY - 1 else "completed"
        for i in range(len(ended))
    ]
    detail = (
        tally(ended)
        + "; "
        + (", ".join(busy) or f"both KV caches empty within {IDLE_TIMEOUT_S}s")
    )
    return Check(
        "fault: clients disconnect under load", ended == expected and not busy, detail
    )


def run_faults(layout: Layout, prompts: Sequence[Sequence[int]]) -> list[Check]:
    """The fault cases above on one fresh pair of the patched build."""
    model = layout.models[CASE.model]
    results = []
    try:
        with ExitStack() as stack:
            pool = stack.enter_context(ThreadPoolExecutor(max_workers=IN_FLIGHT))
            pair = start_pair(
                stack,
                layout,
                PATCHED,
                CASE.model,
                CASE.decode,
                "faults",
                CASE.prefix_caching,
                CASE.decode_args,
            )
            complete(pair.proxy_port, model, prompts[0])
            results.append(aborts_under_load(pool, pair, model))

            params = prefill_only(pair.prefill_port, model, prompts[1])
            # A new engine id too: the decode server keeps the agents it
            # already shook hands with by engine id, and would not look at
            # the address of a known one.
            dead = {
                **params,
                "remote_engine_id": "no-such-engine",
                "remote_port": free_port(),
            }
            ok, detail = outcome(decode_with(pair.decode_port, model, prompts[1], dead))
            results.append(
                Check("fault: kv_transfer_params name a dead address", ok, detail)
            )

            params = prefill_only(pair.prefill_port, model, prompts[2])
            in_flight, first = start_streams(pool, pair, model, abort_every=0)
            first.wait(FIRST_TOKEN_WAIT_S)
            pair.prefill.kill()
            ok, detail = outcome(
                decode_with(pair.decode_port, model, prompts[2], params)
            )
            results.append(
                Check("fault: the prefill server killed before the pull", ok, detail)
            )
            ended = outcomes(in_flight)
            busy = idle_usage({"decode": pair.decode_port})
            results.append(
                Check(
                    "fault: the prefill server killed under load",
                    "hung" not in ended and not busy,
                    tally(ended)
                    + "; "
                    + (
                        ", ".join(busy)
                        or f"decode KV cache empty within {IDLE_TIMEOUT_S}s"
                    ),
                )
            )

            ok, detail = outcome(plain(pair.decode_port, model, prompts[3]))
            results.append(
                Check("fault: the decode server serves on afterwards", ok, detail)
            )

            ok, detail = outcome(plain(pair.proxy_port, model, prompts[3]))
            failed_cleanly = ok and detail.startswith("HTTP ")
            results.append(
                Check(
                    "fault: the proxy fails cleanly without its prefill server",
                    failed_cleanly,
                    detail,
                )
            )
            pair.stop()
    except (OSError, HTTPException, OverlayError) as exc:
        results.append(Check("fault cases", False, str(exc)))
    return results
