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

With vLLM's default `kv_load_failure_policy` ("fail", config/kv_transfer.py
in 0.32.0) a failed pull ends the request with an error; NIXL gives up a
handshake after VLLM_P2P_HANDSHAKE_TIMEOUT_S (30 s by default, envs.py:238).
"""

import time
import urllib.error
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from http.client import HTTPException
from pathlib import Path

from ci.pd.cases import CASE_BY_KEY, Check
from ci.pd.completions import (
    MAX_TOKENS,
    complete,
    completion_body,
    parse_completion,
    post,
)
from ci.pd.pair import PATCHED, Layout, start_pair
from ci.servers import free_port
from vllm_overlay.errors import OverlayError

CASE = CASE_BY_KEY["hybrid-multi"]
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


def run_faults(layout: Layout, prompts: Sequence[Sequence[int]]) -> list[Check]:
    """The fault cases above on one fresh pair of the patched build."""
    model = layout.models[CASE.model]
    results = []
    try:
        with ExitStack() as stack:
            pair = start_pair(stack, layout, PATCHED, CASE.model, CASE.decode, "faults")
            complete(pair.proxy_port, model, prompts[0])

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
            pair.prefill.kill()
            ok, detail = outcome(
                decode_with(pair.decode_port, model, prompts[2], params)
            )
            results.append(
                Check("fault: the prefill server killed before the pull", ok, detail)
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
