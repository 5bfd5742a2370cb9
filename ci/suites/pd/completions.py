"""Greedy completions through a P/D pair, and how two sets compare.

Prompts are token ids, not text: the counts are exact and no tokenizer is
involved. Each completion is asked with `logprobs` 2 and
`return_tokens_as_token_ids`, so that its tokens and, per token, the gap
between the best and the second-best logprob come back: the margin of a
greedy comparison is measured, not assumed.
"""

import http.client
import json
import math
import random
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_overlay.common.errors import OverlayError

# Four prompts sharing a prefix that spans several hybrid blocks (the CPU
# platform raises the block size to a few hundred tokens for hybrids), each
# with its own tail, and a few greedy tokens each.
NUM_PROMPTS = 4
PREFIX_TOKENS = 1400
PROMPT_TOKENS = 1500
MAX_TOKENS = 16
PROMPT_SEED = 14
# Token ids the prompts draw from: the tiny vocabulary without its specials.
FIRST_ORDINARY_TOKEN = 3
VOCAB_SIZE = 2048
REQUEST_TIMEOUT_S = 120


@dataclass(frozen=True)
class Completion:
    """One greedy completion: its token ids, their logprobs, and per token the
    gap between the best and the second-best logprob."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    gaps: tuple[float, ...]


def make_prompts(
    count: int = NUM_PROMPTS,
    prefix: int = PREFIX_TOKENS,
    length: int = PROMPT_TOKENS,
    seed: int = PROMPT_SEED,
) -> list[list[int]]:
    """`count` prompts of `length` token ids sharing their first `prefix`,
    drawn from the ordinary tokens under a fixed seed."""
    rng = random.Random(seed)

    def draw(n: int) -> list[int]:
        return [rng.randrange(FIRST_ORDINARY_TOKEN, VOCAB_SIZE) for _ in range(n)]

    shared = draw(prefix)
    return [shared + draw(length - prefix) for _ in range(count)]


def parse_completion(answer: Mapping[str, object]) -> Completion:
    """A `/v1/completions` answer requested with `logprobs` 2 and
    `return_tokens_as_token_ids` (tokens spelled `token_id:<id>`)."""
    try:
        choice = answer["choices"][0]  # type: ignore[index]
        logprobs = choice["logprobs"]
        tokens = [int(t.removeprefix("token_id:")) for t in logprobs["tokens"]]
        chosen = [float(x) for x in logprobs["token_logprobs"]]
        gaps = []
        for top in logprobs["top_logprobs"]:
            best = sorted(top.values(), reverse=True)
            gaps.append(best[0] - best[1] if len(best) > 1 else math.inf)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise OverlayError(
            f"unexpected completion answer ({exc!r}): {answer}"
        ) from None
    return Completion(tuple(tokens), tuple(chosen), tuple(gaps))


def compare(
    reference: Sequence[Completion], got: Sequence[Completion]
) -> tuple[tuple[int, ...], float, float]:
    """The indices of the completions whose tokens differ from the
    reference's, the smallest top-two gap of `got`, and the largest logprob
    difference from the reference over the positions before the first
    differing token of each completion."""
    if len(reference) != len(got):
        raise OverlayError(f"{len(got)} completions for {len(reference)} prompts")
    differing, deltas = [], [0.0]
    for index, (ref, out) in enumerate(zip(reference, got, strict=True)):
        if ref.token_ids != out.token_ids:
            differing.append(index)
        for r_id, o_id, r_lp, o_lp in zip(
            ref.token_ids, out.token_ids, ref.logprobs, out.logprobs, strict=False
        ):
            if r_id != o_id:
                break
            deltas.append(abs(r_lp - o_lp))
    gaps = [gap for completion in got for gap in completion.gaps]
    return tuple(differing), min(gaps, default=math.nan), max(deltas)


def post(
    port: int,
    path: str,
    body: Mapping[str, object],
    timeout: float = REQUEST_TIMEOUT_S,
) -> dict[str, object]:
    """POST `body` as JSON to 127.0.0.1:`port`; the JSON answer, within
    `timeout` seconds."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as response:
        return json.load(response)


class HTTPStatusError(OverlayError):
    """A streamed request answered with another status than 200."""


def streamed_tokens(
    port: int, body: Mapping[str, object], timeout: float = REQUEST_TIMEOUT_S
) -> Iterator[list[int]]:
    """POST `body` (a completion request with `stream`, `logprobs` and
    `return_tokens_as_token_ids`) to 127.0.0.1:`port` and yield the token ids
    of each streamed chunk as it arrives. Closing the iterator early
    disconnects the client."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(
            "POST",
            "/v1/completions",
            json.dumps(body),
            {"Content-Type": "application/json"},
        )
        response = conn.getresponse()
        if response.status != 200:
            text = response.read().decode(errors="replace")[:120]
            raise HTTPStatusError(f"HTTP {response.status} {text}")
        for line in response:
            data = line.decode(errors="replace").strip().removeprefix("data: ")
            if not data.startswith("{"):
                continue
            logprobs = json.loads(data)["choices"][0].get("logprobs") or {}
            spelled = logprobs.get("tokens") or []
            yield [int(token.removeprefix("token_id:")) for token in spelled]
    finally:
        conn.close()


def completion_body(model: Path, prompt: Sequence[int]) -> dict[str, object]:
    return {
        "model": str(model),
        "prompt": list(prompt),
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        # A random model may say </s> anywhere: every completion has the same
        # length, so that all runs compare the same positions.
        "ignore_eos": True,
        "logprobs": 2,
        "return_tokens_as_token_ids": True,
    }


def complete(port: int, model: Path, prompt: Sequence[int]) -> Completion:
    completion = parse_completion(
        post(port, "/v1/completions", completion_body(model, prompt))
    )
    if len(completion.token_ids) != MAX_TOKENS:
        raise OverlayError(f"{len(completion.token_ids)} tokens, not {MAX_TOKENS}")
    return completion


def complete_all(
    port: int, model: Path, prompts: Sequence[Sequence[int]]
) -> list[Completion]:
    """The prompts one after the other (so each finds the previous ones in
    the prefix caches), greedy."""
    return [complete(port, model, prompt) for prompt in prompts]
