"""Tiny random-weight checkpoints that a CPU engine starts in seconds.

The end-to-end serve test needs models that load and answer, not ones that
say anything sensible: a few layers, a 2,048-token byte-level BPE vocabulary
and random weights under a fixed seed, written with the hub stand-in's
tokenizer and weight writers (`ci/hf_standin.py`). Each is a plain directory,
served by path, so no hub cache or network is involved.

- `tiny-llama`: a plain decoder, two layers, float32.
- `tiny-qwen3.5`: a hybrid in Qwen3.5's layout, three Gated DeltaNet (linear
  attention) layers to one full-attention layer. Its linear-attention head
  size is 128: vLLM's CPU Gated DeltaNet kernel rejects smaller ones; and it
  is bfloat16, the only dtype that kernel takes.
- `tiny-qwen3-next`: the same hybrid layout in Qwen3-Next's architecture,
  for vLLM 0.22.1, which has no text-only Qwen3.5 (`Qwen3_5ForCausalLM`
  came in 0.31.0). Qwen3-Next's vLLM model needs at least one mixture-of-
  experts layer (it raises "No Qwen3Next layer found" otherwise), so each
  layer's MLP is a small MoE: four experts, two per token, and a shared one.
- `tiny-nemotron-h`: a Mamba2 hybrid in Nemotron-H's layout (Mamba2, MLP,
  Mamba2, attention, MLP), float32.
- `tiny-gemma3`: sliding-window and full attention in Gemma 3's layout (a
  model with two attention groups and no recurrent state), for the GPU
  driver's LMCache case.

Writing one needs `tokenizers`, `torch` and `transformers`:
`ensure_tiny_model` runs this module (`python -m ci.tiny_model NAME TARGET`)
under a release environment's Python, from the repository root, where `ci`
and `vllm_overlay` import from this checkout.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ci.hf_standin import Vocabulary, write_random_weights, write_tokenizer
from vllm_overlay.errors import OverlayError
from vllm_overlay.locations import REPO_ROOT
from vllm_overlay.locking import exclusive

_COMMON: dict[str, object] = {
    "bos_token_id": 0,
    "eos_token_id": 1,
    "hidden_act": "silu",
    "hidden_size": 256,
    "intermediate_size": 512,
    "max_position_embeddings": 2048,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 2048,
}
# Three Gated DeltaNet layers to one full-attention layer, as Qwen3.5 and
# Qwen3-Next lay them out.
_GDN_LAYOUT: dict[str, object] = {
    "head_dim": 64,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 2,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "rms_norm_eps": 1e-06,
}
CONFIGS: dict[str, dict[str, object]] = {
    "tiny-llama": {
        **_COMMON,
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "torch_dtype": "float32",
        "num_hidden_layers": 2,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
    },
    "tiny-qwen3.5": {
        **_COMMON,
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        **_GDN_LAYOUT,
    },
    "tiny-qwen3-next": {
        **_COMMON,
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        **_GDN_LAYOUT,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 128,
        "shared_expert_intermediate_size": 128,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    },
    "tiny-nemotron-h": {
        **_COMMON,
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "torch_dtype": "float32",
        "head_dim": 64,
        "hybrid_override_pattern": "M-M*-",
        "mamba_num_heads": 8,
        "mamba_head_dim": 64,
        "n_groups": 1,
        "ssm_state_size": 64,
        "conv_kernel": 4,
        "expand": 2,
        "chunk_size": 128,
        "mlp_hidden_act": "relu2",
        "layer_norm_epsilon": 1e-05,
    },
    "tiny-gemma3": {
        **_COMMON,
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "head_dim": 64,
        "hidden_activation": "gelu_pytorch_tanh",
        "layer_types": ["sliding_attention", "full_attention"],
        "num_hidden_layers": 2,
        "query_pre_attn_scalar": 64,
        "rms_norm_eps": 1e-06,
        "sliding_window": 128,
    },
}
VOCABULARY = Vocabulary(
    size=2048,
    specials={0: "<s>", 1: "</s>", 2: "<unk>"},
    bos="<s>",
    eos="</s>",
    unk="<unk>",
    add_bos=True,
)
STAMP = ".vllm-overlay-tiny-model"


def model_digest(name: str) -> str:
    """Changes whenever the checkpoint `name` would."""
    payload = json.dumps([CONFIGS[name], repr(VOCABULARY)], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def ensure_tiny_model(name: str, models: Path, python: Path) -> Path:
    """The checkpoint `name` in `models/name`, written (with `python`)
    unless current."""
    target = models / name
    stamp = target / STAMP
    if stamp.is_file() and stamp.read_text().strip() == model_digest(name):
        return target
    with exclusive(models):
        if stamp.is_file() and stamp.read_text().strip() == model_digest(name):
            return target
        # Absolute paths: the child runs in REPO_ROOT, not in the caller's
        # working directory.
        command = [str(python.absolute()), "-m", "ci.tiny_model", name]
        proc = subprocess.run(
            [*command, str(target.absolute())], cwd=REPO_ROOT, check=False
        )
        if proc.returncode:
            raise OverlayError(f"writing the tiny model into {target} failed")
    return target


def write_tiny_model(name: str, target: Path) -> None:
    """Write the checkpoint `name` beside `target` and move it in whole."""
    target.parent.mkdir(parents=True, exist_ok=True)
    config = json.dumps(CONFIGS[name], indent=2) + "\n"
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".building-") as tmp:
        staging = Path(tmp) / "model"
        staging.mkdir()
        (staging / "config.json").write_text(config)
        write_tokenizer(staging, VOCABULARY)
        write_random_weights(staging)
        (staging / STAMP).write_text(model_digest(name) + "\n")
        if target.exists():
            os.replace(target, Path(tmp) / "old")
        os.replace(staging, target)


def main(argv: list[str] | None = None) -> int:
    """Write the checkpoint NAME into TARGET (what `ensure_tiny_model` runs)."""
    parser = argparse.ArgumentParser(
        prog="python -m ci.tiny_model", description=main.__doc__
    )
    parser.add_argument("name", choices=sorted(CONFIGS))
    parser.add_argument("target", type=Path)
    args = parser.parse_args(argv)
    write_tiny_model(args.name, args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
