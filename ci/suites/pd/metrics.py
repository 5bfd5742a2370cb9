"""What a decode server's `/metrics` counted over one run.

vLLM exposes Prometheus text; `prometheus_client`'s own parser reads it (the
same package vLLM writes it with). The counters, in vLLM 0.32.0:
`vllm:prompt_tokens_by_source{source=local_cache_hit|external_kv_transfer|
local_compute}` (v1/metrics/loggers.py:758, stats.py:426-471: tokens reused
from the local prefix cache, pulled from the prefill server, computed),
`vllm:prefix_cache_queries|hits` and `vllm:external_prefix_cache_queries|hits`
(loggers.py:662-708), `vllm:time_to_first_token_seconds` (a histogram,
loggers.py:931: at the decode server, the pull and the rest of the prefill)
and `vllm:nixl_bytes_transferred` (a histogram, nixl/stats.py:207-216).
With speculative decoding, `vllm:spec_decode_num_drafts|num_draft_tokens|
num_accepted_tokens` (v1/spec_decode/metrics.py:229-231 in 0.31.0-0.33.0):
the drafts proposed, their tokens, and the tokens the main model accepted.
"""

import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from vllm_overlay.common.errors import OverlayError

METRICS_TIMEOUT_S = 15

Sample = tuple[str, dict[str, str], float]


@dataclass(frozen=True)
class DecodeCounts:
    """What the decode server's `/metrics` counted over one run."""

    reused: int
    pulled: int
    computed: int
    prefix_queries: int
    prefix_hits: int
    external_queries: int
    external_hits: int
    nixl_bytes: int
    ttft_s: float
    requests: int
    # Speculative decoding's drafts, draft tokens and accepted tokens (zero
    # without it).
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        """The share of draft tokens the main model accepted."""
        if not self.draft_tokens:
            return float("nan")
        return self.accepted_tokens / self.draft_tokens

    @property
    def mean_ttft_s(self) -> float:
        return self.ttft_s / self.requests if self.requests else float("nan")

    def same_tokens(self, other: "DecodeCounts") -> bool:
        """The same token counts (what was reused, pulled, computed and
        queried), whatever the bytes and the times."""
        keys = (
            "reused",
            "pulled",
            "computed",
            "prefix_queries",
            "prefix_hits",
            "external_queries",
            "external_hits",
        )
        return all(getattr(self, k) == getattr(other, k) for k in keys)


def parse_metrics(text: str) -> list[Sample]:
    """The samples of a Prometheus text exposition: (name, labels, value)."""
    try:
        return [
            (sample.name, dict(sample.labels), sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        ]
    except ValueError as exc:
        raise OverlayError(f"unreadable /metrics ({exc})") from None


def metric_sum(samples: Sequence[Sample], name: str, **labels: str) -> float:
    """The sum of the samples named `name` whose labels include `labels`
    (over engines, and over the children of a MultiConnector)."""
    return sum(
        value
        for sample, have, value in samples
        if sample == name and all(have.get(k) == v for k, v in labels.items())
    )


def decode_counts(before: Sequence[Sample], after: Sequence[Sample]) -> DecodeCounts:
    """What the counters of `after` added to those of `before`."""

    def delta(name: str, **labels: str) -> float:
        return metric_sum(after, name, **labels) - metric_sum(before, name, **labels)

    by_source = "vllm:prompt_tokens_by_source_total"
    ttft = "vllm:time_to_first_token_seconds"
    return DecodeCounts(
        reused=round(delta(by_source, source="local_cache_hit")),
        pulled=round(delta(by_source, source="external_kv_transfer")),
        computed=round(delta(by_source, source="local_compute")),
        prefix_queries=round(delta("vllm:prefix_cache_queries_total")),
        prefix_hits=round(delta("vllm:prefix_cache_hits_total")),
        external_queries=round(delta("vllm:external_prefix_cache_queries_total")),
        external_hits=round(delta("vllm:external_prefix_cache_hits_total")),
        nixl_bytes=round(delta("vllm:nixl_bytes_transferred_sum")),
        ttft_s=delta(f"{ttft}_sum"),
        requests=round(delta(f"{ttft}_count")),
        drafts=round(delta("vllm:spec_decode_num_drafts_total")),
        draft_tokens=round(delta("vllm:spec_decode_num_draft_tokens_total")),
        accepted_tokens=round(delta("vllm:spec_decode_num_accepted_tokens_total")),
    )


def scrape(port: int) -> list[Sample]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return parse_metrics(r.read().decode())


def settled_metrics(
    port: int, before: Sequence[Sample], prompt_tokens: int
) -> list[Sample]:
    """`/metrics` once the API server has recorded every prompt token of the
    run (it records engine stats as they arrive, after the answer may have
    gone out)."""
    deadline = time.monotonic() + METRICS_TIMEOUT_S
    while True:
        after = scrape(port)
        counted = metric_sum(after, "vllm:prompt_tokens_total") - metric_sum(
            before, "vllm:prompt_tokens_total"
        )
        if counted >= prompt_tokens or time.monotonic() > deadline:
            return after
        time.sleep(0.5)
