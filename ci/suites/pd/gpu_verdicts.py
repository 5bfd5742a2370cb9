"""The verdicts on the GPU driver's single-server runs (`ci/suites/gpu_e2e.py`
runs them; its docstring says what each case is for): LMCacheConnectorV1 on
the hybrid refused upstream and inert patched, on the sliding-window model
hitting as upstream does, and LMCacheMPConnector hitting on both builds.

Beside the P/D cases' verdicts (`cases.py`) because they judge the same
counts (`metrics.DecodeCounts`) and answers (`completions.Completion`), and
so that they are tested without a GPU.
"""

from dataclasses import dataclass

from ci.suites.pd.cases import UNIFY_REFUSAL, Check
from ci.suites.pd.completions import Completion
from ci.suites.pd.metrics import DecodeCounts
from ci.suites.pd.pair import PATCHED, UNPATCHED

# The roles of the single-server cases' models; HYBRID is the release's
# Gated DeltaNet hybrid (`gdn_hybrid` in the release facts).
HYBRID, SLIDING = "gdn-hybrid", "tiny-gemma3"


@dataclass
class Single:
    """One single-server run: the repeated prompt's answers and counts."""

    completions: list[Completion]
    first: DecodeCounts
    repeat: DecodeCounts


def counts_as_upstream(what: str, patched: Single, upstream: Single) -> Check:
    """The patched build's repeated request counted and answered as the
    unpatched release's: a connector no patch is about stays upstream's."""
    return Check(
        f"gpu: {what} counts as upstream (scope)",
        patched.repeat.same_tokens(upstream.repeat)
        and patched.completions == upstream.completions,
        f"{patched.repeat.external_hits} vs {upstream.repeat.external_hits} "
        "external hits",
    )


def judge_mp(
    runs: dict[tuple[str, str, bool], Single | str], mp: dict[str, Single | str]
) -> list[Check]:
    """LMCacheMPConnector on the hybrid: hits on the repeated prompt, the
    output of the server without a connector, and the patched build counting
    what upstream counts (no patch touches it)."""
    plain, patched, upstream = runs[PATCHED, HYBRID, False], mp[PATCHED], mp[UNPATCHED]
    for label, run in (("no connector", plain), ("LMCacheMPConnector", patched)):
        if isinstance(run, str):
            return [Check(f"gpu: {HYBRID}: patched, {label}", False, run[-300:])]
    hits = patched.repeat.external_hits
    results = [
        Check(
            f"gpu: {HYBRID}: LMCacheMPConnector hits on the repeat",
            hits > 0,
            f"{hits} external hits",
        ),
        Check(
            f"gpu: {HYBRID}: LMCacheMPConnector output = no connector",
            patched.completions == plain.completions,
            f"repeat TTFT {patched.repeat.mean_ttft_s * 1e3:.1f} ms, "
            f"{plain.repeat.mean_ttft_s * 1e3:.1f} ms without",
        ),
    ]
    if isinstance(upstream, str):
        results.append(
            Check(
                f"gpu: {HYBRID}: unpatched, LMCacheMPConnector", False, upstream[-300:]
            )
        )
    else:
        results.append(
            counts_as_upstream(f"{HYBRID}: LMCacheMPConnector", patched, upstream)
        )
    return results


def judge_single(
    model: str, runs: dict[tuple[str, str, bool], Single | str]
) -> list[Check]:
    """The verdicts of one model's single-server runs (see the docstring)."""
    plain, lm = runs[PATCHED, model, False], runs[PATCHED, model, True]
    upstream = runs[UNPATCHED, model, True]
    out = []
    if model == HYBRID:
        out.append(
            Check(
                "gpu: unpatched LMCacheConnectorV1 on a hybrid refused (control)",
                isinstance(upstream, str) and UNIFY_REFUSAL in upstream,
                "refused" if isinstance(upstream, str) else "it started",
            )
        )
    for label, run in (
        ("patched, no connector", plain),
        ("patched, LMCacheConnectorV1", lm),
    ):
        if isinstance(run, str):
            return [*out, Check(f"gpu: {model}: {label}", False, run[-300:])]
    hits = lm.repeat.external_hits
    ttft = (
        f"repeat TTFT {lm.repeat.mean_ttft_s * 1e3:.1f} ms, "
        f"{plain.repeat.mean_ttft_s * 1e3:.1f} ms without"
    )
    out.append(
        Check(
            f"gpu: {model}: LMCache output = no connector",
            lm.completions == plain.completions,
            ttft,
        )
    )
    if model == HYBRID:
        out.append(
            Check(
                f"gpu: {model}: zero LMCache hits (inert)",
                hits == 0,
                f"{hits} external hits",
            )
        )
    else:
        out.append(
            Check(
                f"gpu: {model}: LMCache hits on the repeat",
                hits > 0,
                f"{hits} external hits",
            )
        )
        if not isinstance(upstream, str):
            out.append(counts_as_upstream(f"{model}: LMCache", lm, upstream))
    return out
