"""How a CPU prefill server should serve the reads of its finished
requests: at its engine's steps, as the patched builds do (no NIXL progress
thread, `nixl-cpu-no-busy-progress-thread`; the engine steps on while a
read can reach it, `nixl-decode-confirms-reads`), or with NIXL's progress
thread back and pausing between its polls. Issue 37 asks which costs less.

Two measurements, on the release's test environment (the patched build of
this checkout):

1. Two NIXL agents alone (`nixl_idle_read.py` beside it), each process on a
   core of its own: a READ from a target that never calls into NIXL, with
   no progress thread and with one pausing each of `PAUSES_US`, over UCX's
   default transports and over tcp alone; and the CPU time the idle target
   spent meanwhile.
2. The P/D pair of `benchmarks/pd_decode_reuse.py` (tiny Qwen3.5 hybrid,
   each server confined to its core, the decode cache capped), plain
   NixlConnector and MultiConnector[NixlConnector, DecodeBenchConnector] on
   the decode side, at the engine's steps ("steps") and with the progress
   thread pausing `--pause-ms` in every agent of both servers ("progress
   thread, both servers") or of the prefill server alone ("progress thread,
   prefill"), arms interleaved over rounds. NIXL's Python API cannot set
   the pause (`benchmarks/investigations/nixl_progress_pause.py` says why), so a server
   with the thread runs in an environment of its own whose startup sets it.

Usage: python -m benchmarks.investigations.pd_progress_pause [RELEASE] [--rounds N]
    [--concurrency C ...] [--prompts N] [--pause-ms MS] [--agents-only]
(the release's test environment must exist: tools/test.sh RELEASE)
"""

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks.pd_decode_reuse import (
    Arm,
    Results,
    arm_table,
    cell_workloads,
    measure,
    rounds_parser,
)
from benchmarks.pd_read_confirmation import (
    DECODE_SIDES,
    hooked_env,
    ratio_rows,
)
from ci.suites.pd.bench import Workload
from ci.suites.pd.pair import PATCHED
from vllm_overlay.common import cache_layout
from vllm_overlay.common.errors import OverlayError, report_error
from vllm_overlay.common.locations import cache_root

HERE = Path(__file__).resolve().parent
HOOK = HERE / "nixl_progress_pause.py"
IDLE_READ = HERE / "nixl_idle_read.py"
PAUSES_US = (0, 1_000, 10_000, 100_000)
# UCX_TLS per row: UCX's own choice (shared memory between two processes of
# this machine), and tcp, which a peer on another host may be left with.
TRANSPORTS = (("UCX's default", None), ("tcp", "tcp"))
STEPS = "steps"
# The thread on both servers, as a platform-wide change would give it, and on
# the prefill server alone, the one whose agent serves the reads.
THREADS = {"progress thread, both servers": False, "progress thread, prefill": True}
AGENT_LIMIT_S = 60


def idle_read(python: Path, pause_us: int, transport: str | None) -> dict:
    """Both agents' results for one row of measurement 1."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("UCX_")}
    if transport:
        env["UCX_TLS"] = transport
    env["PYTHONPATH"] = str(HERE)
    with tempfile.TemporaryDirectory(prefix="idle-read-") as folder:
        run = [str(python), str(IDLE_READ)]
        target = subprocess.Popen(
            ["taskset", "-c", "0", *run, "target", folder, str(pause_us)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            read = subprocess.run(
                ["taskset", "-c", "1", *run, "reader", folder],
                env=env,
                capture_output=True,
                text=True,
                timeout=AGENT_LIMIT_S,
            )
            out, err = target.communicate(timeout=AGENT_LIMIT_S)
        finally:
            if target.poll() is None:
                target.kill()
                target.wait()
    for role, code, stderr in (
        ("reader", read.returncode, read.stderr),
        ("target", target.returncode, err),
    ):
        if code:
            last = stderr.strip().splitlines()[-1:] or ["no output"]
            raise OverlayError(
                f"the idle-read {role} (pause {pause_us} us) exited {code}: {last[0]}"
            )
    # NIXL logs to stdout too: the result is the last line.
    return {
        **json.loads(out.splitlines()[-1]),
        **json.loads(read.stdout.splitlines()[-1]),
    }


def agents_table(python: Path) -> None:
    print("\nA READ from an idle NIXL agent (1 MiB, two processes on this machine):")
    print(
        "| transport | target's progress thread | first read (opens the connection) | "
        "second read | data arrived | target's CPU while idle |"
    )
    print("|---|---|---|---|---|---|")
    for label, transport in TRANSPORTS:
        for pause_us in PAUSES_US:
            row = idle_read(python, pause_us, transport)
            thread = f"pause {pause_us // 1000} ms" if pause_us else "none"
            first, second = row["first_read_s"], row["second_read_s"]
            reads = [
                "not done in 2 s" if first is None else f"{first * 1000:.1f} ms",
                "-" if first is None else f"{second * 1000:.1f} ms",
            ]
            print(
                f"| {label} | {thread} | {reads[0]} | {reads[1]} | "
                f"{'yes' if row['data_arrived'] else 'no'} | "
                f"{row['idle_cpu_s']:.3f} s of {row['idle_s']:.1f} s |",
                flush=True,
            )


def thread_env(release: str, pause_ms: int) -> tuple[str, Path]:
    """The layered environment whose every NIXL agent runs the progress
    thread with the pause, by its build name."""
    name = f"progress-pause-{pause_ms}ms"
    return name, hooked_env(release, name, HOOK, f"install({pause_ms * 1000})")


def arms(thread_build: str) -> tuple[Arm, ...]:
    return tuple(
        arm
        for side, key in DECODE_SIDES
        for arm in (
            Arm(f"{side}, {STEPS}", PATCHED, key),
            *(
                Arm(f"{side}, {name}", PATCHED, key, prefill_build=thread_build)
                if prefill_only
                else Arm(f"{side}, {name}", thread_build, key)
                for name, prefill_only in THREADS.items()
            ),
        )
    )


def report(
    results: Results, rounds: int, cells: Sequence[Workload], pause_ms: int
) -> None:
    arm_table(results, rounds, cells)
    print(
        f"\nRatios to {STEPS}, the thread pausing {pause_ms} ms "
        "(median over rounds, min-max):"
    )
    ratio_rows(
        results,
        "arm",
        lambda side: [
            (name, f"{side}, {name}", f"{side}, {STEPS}") for name in THREADS
        ],
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = rounds_parser(__doc__, concurrency=(4, 12))
    parser.add_argument("--pause-ms", type=int, default=1)
    parser.add_argument("--agents-only", action="store_true")
    args = parser.parse_args(argv)
    if args.pause_ms < 1:
        parser.error("--pause-ms must be at least 1 (0 is NIXL's busy thread)")
    release_python = (
        cache_layout.release_env(cache_root(), args.release) / "bin" / "python"
    )
    print(f"vLLM {args.release}, this checkout's patched build")
    try:
        if not release_python.is_file():
            raise OverlayError(
                f"no test environment for {args.release}: "
                f"run tools/test.sh {args.release}"
            )
        agents_table(release_python)
        if args.agents_only:
            return 0
        cells = cell_workloads("cpu", args.concurrency, args.prompts)
        build, env = thread_env(args.release, args.pause_ms)
        results = measure(
            args.release, args.rounds, cells, arms(build), ["capped"], {build: env}
        )
    except (OverlayError, subprocess.SubprocessError) as exc:
        report_error(OverlayError(str(exc)))
        return 1
    report(results, args.rounds, cells, args.pause_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
