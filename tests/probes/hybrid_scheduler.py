"""The real v1 `Scheduler` over a hybrid model's KV cache, built offline.

Shared by the probes (through `conftest.py`) and by
`benchmarks/schedule_overhead.py`, so that the benchmark times the same
scheduler the probes prove things about: one full-attention group and one
Mamba group in "align" mode (a state checkpoint per block), as a hybrid
model with prefix caching has. Imports vLLM: the caller resolves vLLM's
platform first (see `conftest.py`).
"""

from __future__ import annotations

import torch
from vllm.config import VllmConfig
from vllm.model_executor.models import ModelRegistry
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import (
    get_request_block_hasher,
    resolve_kv_cache_block_sizes,
)
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

BLOCK_SIZE = 16
NUM_GPU_BLOCKS = 256


def tiny_llama_config(max_model_len: int) -> dict[str, object]:
    """The `config.json` of a one-layer Llama small enough to describe in a
    dict, for a local model directory (`ModelConfig` then asks no hub); no
    weights are needed because nothing here runs the model."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "num_hidden_layers": 1,
        "vocab_size": 256,
        "max_position_embeddings": max_model_len,
        "rms_norm_eps": 1e-6,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    }


def text_hybrid_config(qwen3_5: dict[str, object]) -> dict[str, object]:
    """`qwen3_5`, a text-only Qwen3.5 `config.json`, where the installed vLLM
    registers that model; else the same layout as Qwen3-Next (Qwen3.5's with
    MoE layers). 0.22.1 registers only the multimodal Qwen3.5
    (Qwen3_5ForConditionalGeneration), for which the scheduler wants an image
    processor."""
    if "Qwen3_5ForCausalLM" in ModelRegistry.get_supported_archs():
        return qwen3_5
    return {
        **qwen3_5,
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "full_attention_interval": 4,
        "num_experts": 2,
        "num_experts_per_tok": 1,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    }


def _attention_spec() -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32
    )


def single_group_kv_cache_config(num_blocks: int = NUM_GPU_BLOCKS) -> KVCacheConfig:
    """One full-attention KV cache group, as a plain decoder would have."""
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], _attention_spec())],
    )


def hybrid_kv_cache_config(
    num_blocks: int = NUM_GPU_BLOCKS,
    mamba_cache_mode: str = "align",
    num_speculative_blocks: int = 0,
) -> KVCacheConfig:
    """A full-attention group and a Mamba group in "align" mode (a state
    checkpoint per block), as a hybrid model with prefix caching has, or in
    the given `mamba_cache_mode`. `num_speculative_blocks` is what vLLM sets
    from `--speculative-config` (its `num_speculative_tokens`, for MTP/EAGLE):
    the Mamba group then holds that many blocks after a request's state."""
    mamba = MambaSpec(
        block_size=BLOCK_SIZE,
        shapes=((1, 1),),
        dtypes=(torch.float32,),
        mamba_cache_mode=mamba_cache_mode,
        num_speculative_blocks=num_speculative_blocks,
    )
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["attention"], _attention_spec()),
            KVCacheGroupSpec(["mamba"], mamba),
        ],
    )


def start_scheduler(
    vllm_config: VllmConfig,
    kv_cache_config: KVCacheConfig,
    planned: bool = False,
) -> Scheduler:
    """The real v1 `Scheduler`; it creates its connector itself. Its block
    size is BLOCK_SIZE, every group's here; for a KV cache config `planned`
    by vLLM, the scheduler and hash block sizes the engine core resolves
    from it (`EngineCore.__init__`), since a group's block size then follows
    the model and the host."""
    if register_all_kvcache_specs is not None:
        register_all_kvcache_specs(vllm_config)
    block_size, hash_block_size = (
        resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
        if planned
        else (BLOCK_SIZE, None)
    )
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        block_size=block_size,
        hash_block_size=hash_block_size,
        log_stats=True,
        structured_output_manager=StructuredOutputManager(vllm_config),
    )


def generation_request(
    request_id: str, prompt_token_ids: list[int], do_remote_prefill: bool = False
) -> Request:
    """A plain generation request (four tokens at most) over the prompt; with
    `do_remote_prefill`, a P/D decode request whose prefill a connector loads.
    Block hashes chain from a process-wide seed the caller sets once
    (`init_none_hash`)."""
    sampling_params = SamplingParams(max_tokens=4)
    sampling_params.update_from_generation_config({}, 2)
    request = Request(
        request_id=request_id,
        prompt_token_ids=prompt_token_ids,
        sampling_params=sampling_params,
        pooling_params=None,
        block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256),
    )
    if do_remote_prefill:
        request.kv_transfer_params = {"do_remote_prefill": True}
    return request


def cache_prefix_without_recurrent_state(
    manager: KVCacheManager, prefix_token_ids: list[int]
) -> list[int]:
    """Leave a decode instance's cache as P/D leaves it: the full-attention
    blocks of the prefix (whole blocks of it) cached, no recurrent-state
    checkpoint inside it. Returns the cached full-attention block ids."""
    fill = generation_request("earlier", prefix_token_ids)
    state_ids = set()
    attention_ids: list[int] = []
    for _ in range(len(prefix_token_ids) // BLOCK_SIZE):
        manager.allocate_slots(fill, BLOCK_SIZE)
        fill.num_computed_tokens += BLOCK_SIZE
        # Align mode checkpoints the state in a new block at every boundary
        # and drops the previous one from the request (it stays cached).
        attention_ids, mamba_ids = manager.get_block_ids(fill.request_id)
        state_ids.update(mamba_ids)
    manager.free(fill)
    manager.block_pool.evict_blocks(state_ids)
    return list(attention_ids)
