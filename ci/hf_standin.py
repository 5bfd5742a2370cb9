"""An offline stand-in for the Hugging Face hub, for upstream's unit tests.

Upstream's tests name hub model ids; vLLM reads each id's config (and often its
tokenizer) while building a `VllmConfig`, so with the hub out of reach
(`HF_HUB_OFFLINE=1`) the tests fail before testing anything. This module writes
a hub cache (`$HF_HOME/hub/models--ORG--NAME/...`, the layout `huggingface_hub`
reads offline) in which every id answers with:

- the public `config.json` values of that model, written out here;
- a byte-level BPE tokenizer built locally with the `tokenizers` library, with
  the model's vocabulary size and its special tokens at their real ids (the
  tests check lengths and ids, never the text a real tokenizer would give);
- random weights, only for the models whose tests start an engine here.

Nothing is downloaded, and the same inputs give the same files. It needs
`tokenizers`, `torch` and `transformers`, which every release environment has:
`write_hf_standin(hf_home, venv_python)` runs it there.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vllm_overlay import atomic
from vllm_overlay.errors import OverlayError, exit_status
from vllm_overlay.locking import exclusive

# Bump when the way files are written changes (the model table is hashed too).
STANDIN_VERSION = 1
STAMP = ".vllm-overlay-standin"
WEIGHT_SEED = 0


@dataclass(frozen=True)
class Vocabulary:
    """A tokenizer's size and the special tokens the tests rely on."""

    size: int
    specials: dict[int, str]
    bos: str | None = None
    eos: str | None = None
    unk: str | None = None
    pad: str | None = None
    add_bos: bool = False


@dataclass(frozen=True)
class StandIn:
    """One hub model id and what its snapshot holds."""

    repo_id: str
    config: dict[str, object]
    vocabulary: Vocabulary
    extra_files: dict[str, dict[str, object]] = field(default_factory=dict)
    random_weights: bool = False


def _qwen_specials(names: tuple[str, ...]) -> dict[int, str]:
    """Qwen tokenizers put their special tokens right after 151,643 BPE tokens."""
    return {151643 + offset: name for offset, name in enumerate(names)}


_QWEN1_5_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_QWEN3_SPECIALS = (
    *_QWEN1_5_SPECIALS,
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
QWEN3_VOCABULARY = Vocabulary(
    size=151643 + len(_QWEN3_SPECIALS),
    specials=_qwen_specials(_QWEN3_SPECIALS),
    eos="<|im_end|>",
    pad="<|endoftext|>",
)


def _llama3_specials() -> dict[int, str]:
    """Llama 3's 256 special tokens: eleven named ones, the rest reserved."""
    named = {
        128000: "<|begin_of_text|>",
        128001: "<|end_of_text|>",
        128004: "<|finetune_right_pad_id|>",
        128006: "<|start_header_id|>",
        128007: "<|end_header_id|>",
        128008: "<|eom_id|>",
        128009: "<|eot_id|>",
        128010: "<|python_tag|>",
    }
    reserved = (i for i in range(128000, 128256) if i not in named)
    return {
        **named,
        **{i: f"<|reserved_special_token_{n}|>" for n, i in enumerate(reserved)},
    }


# Every model id that the upstream tests we run name (see
# `ci/upstream_tests.py`). Only distilgpt2 carries weights: it is the one model
# with which a test that runs here starts an engine (test_engine_logger_apis).
# Qwen/Qwen3.5-0.8B is named only by test_hybrid_prefix_cache_hit_rate.py,
# which needs the real checkpoint and is deselected (ci/deselected.toml).
STANDINS: tuple[StandIn, ...] = (
    StandIn(
        "facebook/opt-125m",
        {
            "architectures": ["OPTForCausalLM"],
            "model_type": "opt",
            "activation_function": "relu",
            "attention_dropout": 0.0,
            "bos_token_id": 2,
            "do_layer_norm_before": True,
            "dropout": 0.1,
            "enable_bias": True,
            "eos_token_id": 2,
            "ffn_dim": 3072,
            "hidden_size": 768,
            "init_std": 0.02,
            "layer_norm_elementwise_affine": True,
            "layerdrop": 0.0,
            "max_position_embeddings": 2048,
            "num_attention_heads": 12,
            "num_hidden_layers": 12,
            "pad_token_id": 1,
            "prefix": "</s>",
            "torch_dtype": "float16",
            "use_cache": True,
            "transformers_version": "4.21.0.dev0",
            "vocab_size": 50272,
            "word_embed_proj_dim": 768,
        },
        Vocabulary(
            size=50265,
            specials={0: "<s>", 1: "<pad>", 2: "</s>", 3: "<unk>"},
            bos="</s>",
            eos="</s>",
            unk="</s>",
            pad="<pad>",
            add_bos=True,
        ),
    ),
    StandIn(
        "distilbert/distilgpt2",
        {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "activation_function": "gelu_new",
            "attn_pdrop": 0.1,
            "bos_token_id": 50256,
            "embd_pdrop": 0.1,
            "eos_token_id": 50256,
            "initializer_range": 0.02,
            "layer_norm_epsilon": 1e-05,
            "n_ctx": 1024,
            "n_embd": 768,
            "n_head": 12,
            "n_layer": 6,
            "n_positions": 1024,
            "resid_pdrop": 0.1,
            "vocab_size": 50257,
        },
        Vocabulary(
            size=50257,
            specials={50256: "<|endoftext|>"},
            bos="<|endoftext|>",
            eos="<|endoftext|>",
            unk="<|endoftext|>",
        ),
        random_weights=True,
    ),
    StandIn(
        "Qwen/Qwen1.5-7B",
        {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "attention_dropout": 0.0,
            "bos_token_id": 151643,
            "eos_token_id": 151643,
            "hidden_act": "silu",
            "hidden_size": 4096,
            "initializer_range": 0.02,
            "intermediate_size": 11008,
            "max_position_embeddings": 32768,
            "max_window_layers": 28,
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
            "num_key_value_heads": 32,
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "sliding_window": 32768,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "use_cache": True,
            "use_sliding_window": False,
            "transformers_version": "4.37.0",
            "vocab_size": 151936,
        },
        Vocabulary(
            size=151643 + len(_QWEN1_5_SPECIALS),
            specials=_qwen_specials(_QWEN1_5_SPECIALS),
            eos="<|endoftext|>",
            pad="<|endoftext|>",
        ),
    ),
    StandIn(
        "Qwen/Qwen3-0.6B",
        {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 151643,
            "eos_token_id": 151645,
            "head_dim": 128,
            "hidden_act": "silu",
            "hidden_size": 1024,
            "initializer_range": 0.02,
            "intermediate_size": 3072,
            "max_position_embeddings": 40960,
            "max_window_layers": 28,
            "num_attention_heads": 16,
            "num_hidden_layers": 28,
            "num_key_value_heads": 8,
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 1000000,
            "sliding_window": None,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
            "use_cache": True,
            "use_sliding_window": False,
            "transformers_version": "4.51.0",
            "vocab_size": 151936,
        },
        QWEN3_VOCABULARY,
    ),
    StandIn(
        "Qwen/Qwen3-Next-80B-A3B-Instruct",
        {
            "architectures": ["Qwen3NextForCausalLM"],
            "model_type": "qwen3_next",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 151643,
            "decoder_sparse_step": 1,
            "eos_token_id": 151645,
            "full_attention_interval": 4,
            "head_dim": 256,
            "hidden_act": "silu",
            "hidden_size": 2048,
            "initializer_range": 0.02,
            "intermediate_size": 5120,
            "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 32,
            "linear_value_head_dim": 128,
            "max_position_embeddings": 262144,
            "mlp_only_layers": [],
            "moe_intermediate_size": 512,
            "mtp_num_hidden_layers": 1,
            "mtp_use_dedicated_embeddings": False,
            "norm_topk_prob": True,
            "num_attention_heads": 16,
            "num_experts": 512,
            "num_experts_per_tok": 10,
            "num_hidden_layers": 48,
            "num_key_value_heads": 2,
            "output_router_logits": False,
            "partial_rotary_factor": 0.25,
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 10000000,
            "router_aux_loss_coef": 0.001,
            "shared_expert_intermediate_size": 512,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "use_cache": True,
            "use_sliding_window": False,
            "transformers_version": "4.57.0.dev0",
            "vocab_size": 151936,
        },
        QWEN3_VOCABULARY,
    ),
    StandIn(
        "meta-llama/Llama-3.2-1B-Instruct",
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 128000,
            "eos_token_id": [128001, 128008, 128009],
            "head_dim": 64,
            "hidden_act": "silu",
            "hidden_size": 2048,
            "initializer_range": 0.02,
            "intermediate_size": 8192,
            "max_position_embeddings": 131072,
            "mlp_bias": False,
            "num_attention_heads": 32,
            "num_hidden_layers": 16,
            "num_key_value_heads": 8,
            "pretraining_tp": 1,
            "rms_norm_eps": 1e-05,
            "rope_scaling": {
                "factor": 32.0,
                "high_freq_factor": 4.0,
                "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
                "rope_type": "llama3",
            },
            "rope_theta": 500000.0,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
            "use_cache": True,
            "transformers_version": "4.45.0.dev0",
            "vocab_size": 128256,
        },
        Vocabulary(
            size=128256,
            specials=_llama3_specials(),
            bos="<|begin_of_text|>",
            eos="<|eot_id|>",
            add_bos=True,
        ),
    ),
    StandIn(
        "google/gemma-3-1b-it",
        {
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "attn_logit_softcapping": None,
            "bos_token_id": 2,
            "cache_implementation": "hybrid",
            "eos_token_id": [1, 106],
            "final_logit_softcapping": None,
            "head_dim": 256,
            "hidden_activation": "gelu_pytorch_tanh",
            "hidden_size": 1152,
            "initializer_range": 0.02,
            "intermediate_size": 6912,
            "max_position_embeddings": 32768,
            "num_attention_heads": 4,
            "num_hidden_layers": 26,
            "num_key_value_heads": 1,
            "pad_token_id": 0,
            "query_pre_attn_scalar": 256,
            "rms_norm_eps": 1e-06,
            "rope_local_base_freq": 10000,
            "rope_scaling": None,
            "rope_theta": 1000000,
            "sliding_window": 512,
            "sliding_window_pattern": 6,
            "torch_dtype": "bfloat16",
            "use_cache": True,
            "transformers_version": "4.50.0.dev0",
            "vocab_size": 262144,
        },
        Vocabulary(
            size=262144,
            specials={
                0: "<pad>",
                1: "<eos>",
                2: "<bos>",
                3: "<unk>",
                4: "<mask>",
                105: "<start_of_turn>",
                106: "<end_of_turn>",
            },
            bos="<bos>",
            eos="<eos>",
            unk="<unk>",
            pad="<pad>",
            add_bos=True,
        ),
    ),
    StandIn(
        "llava-hf/llava-1.5-7b-hf",
        {
            "architectures": ["LlavaForConditionalGeneration"],
            "model_type": "llava",
            "ignore_index": -100,
            "image_token_index": 32000,
            "pad_token_id": 32001,
            "projector_hidden_act": "gelu",
            "text_config": {
                "architectures": ["LlamaForCausalLM"],
                "max_position_embeddings": 4096,
                "model_type": "llama",
                "rms_norm_eps": 1e-05,
                "torch_dtype": "float16",
                "vocab_size": 32064,
            },
            "tie_word_embeddings": False,
            "torch_dtype": "float16",
            "vision_config": {
                "hidden_size": 1024,
                "image_size": 336,
                "intermediate_size": 4096,
                "model_type": "clip_vision_model",
                "num_attention_heads": 16,
                "num_hidden_layers": 24,
                "patch_size": 14,
                "projection_dim": 768,
                "vocab_size": 32000,
            },
            "vision_feature_layer": -2,
            "transformers_version": "4.36.0.dev0",
            "vision_feature_select_strategy": "default",
            "vocab_size": 32064,
        },
        Vocabulary(
            size=32002,
            specials={
                0: "<unk>",
                1: "<s>",
                2: "</s>",
                32000: "<image>",
                32001: "<pad>",
            },
            bos="<s>",
            eos="</s>",
            unk="<unk>",
            pad="<pad>",
            add_bos=True,
        ),
        extra_files={
            "preprocessor_config.json": {
                "crop_size": {"height": 336, "width": 336},
                "do_center_crop": True,
                "do_convert_rgb": True,
                "do_normalize": True,
                "do_rescale": True,
                "do_resize": True,
                "image_mean": [0.48145466, 0.4578275, 0.40821073],
                "image_processor_type": "CLIPImageProcessor",
                "image_std": [0.26862954, 0.26130258, 0.27577711],
                "processor_class": "LlavaProcessor",
                "resample": 3,
                "rescale_factor": 0.00392156862745098,
                "size": {"shortest_edge": 336},
            },
            "processor_config.json": {
                "image_token": "<image>",
                "num_additional_image_tokens": 1,
                "patch_size": 14,
                "processor_class": "LlavaProcessor",
                "vision_feature_select_strategy": "default",
            },
        },
    ),
)


def write_hf_standin(hf_home: Path, python: Path | None = None) -> None:
    """Write the stand-in hub cache under `hf_home`, unless the one there is
    already this version of it. Safe to call concurrently.

    Building it needs `tokenizers`, `torch` and `transformers`: pass `python`,
    an interpreter that has them (a release environment's `bin/python`), to
    build it there; without it, this interpreter must have them.
    """
    if _is_current(hf_home):
        return
    if python is not None:
        _write_in(python, hf_home)
        return
    hub = hf_home / "hub"
    with exclusive(hf_home / ".standin.lock"):
        if _is_current(hf_home):
            return
        hub.mkdir(parents=True, exist_ok=True)
        (hub / STAMP).unlink(missing_ok=True)
        remove_stale_repos(hub)
        for standin in STANDINS:
            _progress(f"writing {standin.repo_id}")
            write_repo(hub, standin)
        (hub / STAMP).write_text(standin_digest() + "\n")


def remove_stale_repos(hub: Path) -> None:
    """Delete repositories of model ids no longer in `STANDINS`, so that a
    dropped model's weights do not linger in the cache."""
    wanted = {repo_dir_name(standin.repo_id) for standin in STANDINS}
    for repo in hub.glob("models--*"):
        if repo.name not in wanted:
            shutil.rmtree(repo)


def repo_dir_name(repo_id: str) -> str:
    """The hub cache's directory name for a model id."""
    return "models--" + repo_id.replace("/", "--")


def _is_current(hf_home: Path) -> bool:
    stamp = hf_home / "hub" / STAMP
    return stamp.is_file() and stamp.read_text().strip() == standin_digest()


def _write_in(python: Path, hf_home: Path) -> None:
    """Run this module as a script under `python`."""
    proc = subprocess.run(
        [str(python), str(Path(__file__).resolve()), str(hf_home)], check=False
    )
    if proc.returncode != 0:
        raise OverlayError(
            f"writing the hub stand-in into {hf_home} with {python} failed"
        )


def standin_digest() -> str:
    """A digest of everything the stand-in is made from."""
    table = [asdict(standin) for standin in STANDINS]
    payload = json.dumps([STANDIN_VERSION, WEIGHT_SEED, table], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def revision_of(standin: StandIn) -> str:
    """A fixed 40-hex-digit commit id for the snapshot, derived from its
    contents, shaped like the hub's so every reader accepts it."""
    payload = json.dumps([STANDIN_VERSION, asdict(standin)], sort_keys=True)
    return hashlib.sha1(payload.encode()).hexdigest()


def write_repo(hub: Path, standin: StandIn) -> None:
    """Replace `standin`'s repository in the hub cache with a fresh snapshot.

    The snapshot is built beside the repository and moved in whole, so a reader
    never sees half of it.
    """
    repo = hub / repo_dir_name(standin.repo_id)
    revision = revision_of(standin)
    with tempfile.TemporaryDirectory(dir=hub, prefix=".building-") as tmp:
        staging = Path(tmp) / "repo"
        snapshot = staging / "snapshots" / revision
        snapshot.mkdir(parents=True)
        _write_json(snapshot / "config.json", standin.config)
        for filename, content in standin.extra_files.items():
            _write_json(snapshot / filename, content)
        write_tokenizer(snapshot, standin.vocabulary)
        if standin.random_weights:
            write_random_weights(snapshot)
        (staging / "refs").mkdir()
        (staging / "refs" / "main").write_text(revision)
        atomic.replace_dir(staging, repo)


def write_tokenizer(snapshot: Path, vocabulary: Vocabulary) -> None:
    """`tokenizer.json` and `tokenizer_config.json` for `vocabulary`."""
    build_tokenizer(vocabulary).save(str(snapshot / "tokenizer.json"))
    roles = {
        "bos_token": vocabulary.bos,
        "eos_token": vocabulary.eos,
        "unk_token": vocabulary.unk,
        "pad_token": vocabulary.pad,
    }
    _write_json(
        snapshot / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "clean_up_tokenization_spaces": False,
            **{role: token for role, token in roles.items() if token is not None},
        },
    )


def build_tokenizer(vocabulary: Vocabulary) -> "Tokenizer":
    """A byte-level BPE tokenizer with exactly `vocabulary.size` entries and
    the special tokens at their ids.

    Instead of training on a corpus (which yields however many merges the text
    supports), the merges are enumerated: first every pair of the 256 byte
    symbols, then longer strings, in a fixed order, until the vocabulary is
    full. Any text still tokenizes, since every byte is a symbol.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.processors import TemplateProcessing

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    free_ids = [i for i in range(vocabulary.size) if i not in vocabulary.specials]
    merges = _enumerate_merges(alphabet, len(free_ids) - len(alphabet))
    symbols = alphabet + [left + right for left, right in merges]
    vocab = {symbol: i for symbol, i in zip(symbols, free_ids, strict=True)}
    vocab.update({token: i for i, token in vocabulary.specials.items()})
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [
            AddedToken(token, special=True)
            for _, token in sorted(vocabulary.specials.items())
        ]
    )
    if vocabulary.add_bos and vocabulary.bos:
        bos = (vocabulary.bos, tokenizer.token_to_id(vocabulary.bos))
        tokenizer.post_processor = TemplateProcessing(
            single=f"{bos[0]} $A",
            pair=f"{bos[0]} $A {bos[0]} $B:1",
            special_tokens=[bos],
        )
    if tokenizer.get_vocab_size() != vocabulary.size:
        raise OverlayError(
            f"built a tokenizer of {tokenizer.get_vocab_size()} entries "
            f"instead of {vocabulary.size}"
        )
    return tokenizer


def _enumerate_merges(alphabet: list[str], count: int) -> list[tuple[str, str]]:
    """`count` BPE merges, each joining a known symbol with a byte symbol into
    a new one, breadth first: all two-byte symbols before any longer one."""
    symbols = list(alphabet)
    known = set(symbols)
    merges: list[tuple[str, str]] = []
    position = 0
    while len(merges) < count:
        left = symbols[position]
        position += 1
        for right in alphabet:
            if len(merges) == count:
                break
            if left + right not in known:
                known.add(left + right)
                symbols.append(left + right)
                merges.append((left, right))
    return merges


def write_random_weights(snapshot: Path) -> None:
    """`model.safetensors` for the snapshot's config, randomly initialised by
    transformers under a fixed seed, for tests that start an engine (which
    loads weights but never judges what the model says).

    transformers writes its own `config.json` too; only the weights are kept,
    so the snapshot's config stays the public one.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(snapshot)
    torch.manual_seed(WEIGHT_SEED)
    model = AutoModelForCausalLM.from_config(config, dtype=config.dtype)
    with tempfile.TemporaryDirectory(dir=snapshot.parent) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        for weights in Path(tmp).glob("*.safetensors*"):
            os.replace(weights, snapshot / weights.name)


def _write_json(path: Path, content: dict[str, object]) -> None:
    path.write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")


def _progress(message: str) -> None:
    print(f"vllm-overlay: [hf stand-in] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Write the stand-in hub cache into HF_HOME (the directory given)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: hf_standin.py HF_HOME", file=sys.stderr)
        return 2
    write_hf_standin(Path(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(exit_status(main))
