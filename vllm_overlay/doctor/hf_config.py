"""Whether a model is hybrid, read from its `config.json`.

The fallback for when vLLM cannot build the model's configuration (an
architecture its registry does not know, a missing tokenizer, no vLLM at
all): the Hugging Face config names the layer types in one of a few known
ways. It mirrors `ModelConfig.is_hybrid` as far as a config can: an
architecture vLLM implements as hybrid whose layers are all attention (the
Granite-4.0 "micro" case) is not hybrid. An architecture the config names
is judged by the installed vLLM's model registry where it knows it
(`registry_hybrid`), so that each release's own hybrid classes count.
"""

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_overlay.doctor.facts import ModelFacts

# Layer kinds that keep recurrent state instead of (or besides) a paged KV.
RECURRENT_LAYER_TYPES = frozenset(
    {"linear_attention", "mamba", "mamba2", "ssm", "recurrent", "conv"}
)
# Zamba's "hybrid" blocks are a Mamba mixer plus a shared attention block.
ATTENTION_LAYER_TYPES = frozenset(
    {"attention", "full_attention", "sliding_attention", "chunked_attention", "hybrid"}
)
# Architectures vLLM implements with Mamba / linear-attention mixers next to
# attention (`IsHybrid`), whose configs do not always list layer types: the
# answer when no installed vLLM's registry is asked (`hybrid_from_config`'s
# `registry`), which knows each release's own (0.34.0 added six).
HYBRID_ARCHITECTURES = frozenset(
    {
        "BambaForCausalLM",
        "FalconH1ForCausalLM",
        "GraniteMoeHybridForCausalLM",
        "JambaForCausalLM",
        "KimiLinearForCausalLM",
        "Lfm2ForCausalLM",
        "MiniMaxText01ForCausalLM",
        "NemotronHForCausalLM",
        "Plamo2ForCausalLM",
        "Qwen3NextForCausalLM",
        "Qwen3_5ForCausalLM",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForCausalLM",
        "Qwen3_5MoeForConditionalGeneration",
        "Zamba2ForCausalLM",
    }
)


def registry_hybrid(architecture: str) -> bool | None:
    """Whether the installed vLLM implements `architecture` as hybrid
    (`IsHybrid`), as its model registry inspects the class (in a
    subprocess, cached by vLLM); None for one it does not register. The
    registry knows every architecture of its release, which a list kept
    here did not (0.34.0 added six hybrid ones)."""
    from vllm.model_executor.models.registry import ModelRegistry

    info = ModelRegistry._try_inspect_model_cls(architecture)
    return None if info is None else bool(info.is_hybrid)


@dataclass(frozen=True)
class ConfigVerdict:
    """`hybrid` is None when the config says nothing either way."""

    hybrid: bool | None
    detail: str
    mixed_attention: bool = False


# An architecture's hybridness as an installed vLLM's model registry knows
# it; None for one the registry does not know.
Registry = Callable[[str], bool | None]


def no_registry(architecture: str) -> bool | None:
    """No installed vLLM to ask."""
    return None


def hybrid_from_config(
    config: Mapping[str, Any], registry: Registry = no_registry
) -> ConfigVerdict:
    """Judge a parsed `config.json` (a multimodal model's `text_config` counts
    too): by the layer types it lists, else by its architecture, which
    `registry` (the installed vLLM's) judges, and `HYBRID_ARCHITECTURES`
    where it does not know it."""
    text = config.get("text_config")
    if isinstance(text, Mapping):
        inner = hybrid_from_config(text, registry)
        if inner.hybrid is not None:
            return inner
    architectures = config.get("architectures") or []
    kinds = _layer_kinds(config)
    if kinds:
        recurrent = sorted(kinds & RECURRENT_LAYER_TYPES)
        attention = kinds & ATTENTION_LAYER_TYPES
        mixed = {"sliding_attention", "full_attention"} <= kinds
        detail = f"layer types: {', '.join(sorted(kinds))}"
        return ConfigVerdict(bool(recurrent and attention), detail, mixed)
    for architecture in architectures:
        known = registry(architecture)
        if known is not None:
            return ConfigVerdict(
                known, f"architecture {architecture} (the installed vLLM's registry)"
            )
    hybrid_arch = sorted(set(architectures) & HYBRID_ARCHITECTURES)
    if hybrid_arch:
        return ConfigVerdict(True, f"architecture {hybrid_arch[0]}")
    if "attn_layer_period" in config:
        return ConfigVerdict(True, "attn_layer_period (Jamba-style interleaving)")
    if architectures:
        return ConfigVerdict(False, f"architecture {architectures[0]}")
    return ConfigVerdict(None, "config.json names no architecture or layer types")


def _layer_kinds(config: Mapping[str, Any]) -> set[str]:
    """The layer kinds a config lists: `layer_types` (Qwen3.5, Gemma 3, ...),
    `layers_block_type` (Granite-4, Zamba) or Nemotron-H's
    `hybrid_override_pattern` (M: Mamba, *: attention)."""
    for key in ("layer_types", "layers_block_type"):
        value = config.get(key)
        if isinstance(value, list) and value:
            return {str(kind).lower() for kind in value}
    pattern = config.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        names = {"M": "mamba", "*": "attention"}
        return {names[c] for c in pattern if c in names}
    return set()


def find_config(model: str) -> Path | None:
    """`config.json` of a local model directory, or of a hub id in the local
    Hugging Face cache (never downloaded: doctor reads what `vllm serve`
    would find offline)."""
    local = Path(model).expanduser() / "config.json"
    if local.is_file():
        return local
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(model, "config.json")
    return Path(found) if isinstance(found, str | os.PathLike) else None


def read_config(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def model_from_config_json(name: str, why: str) -> ModelFacts:
    """The config.json fallback; `why` says why vLLM was not asked."""
    path = find_config(name)
    if path is None:
        return ModelFacts(name, None, f"{why}; no config.json found locally")
    verdict = hybrid_from_config(read_config(path), registry_hybrid)
    return ModelFacts(
        name=name,
        hybrid=verdict.hybrid,
        source=f"{path} ({why})",
        detail=verdict.detail,
        mixed_attention=verdict.mixed_attention,
    )
