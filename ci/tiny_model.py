"""A tiny random-weight Llama checkpoint that a CPU engine starts in seconds.

The end-to-end serve test needs a model that loads and answers, not one that
says anything sensible: two layers, a 2,048-token byte-level BPE vocabulary
and random weights under a fixed seed, written with the hub stand-in's
tokenizer and weight writers (`ci/hf_standin.py`). It is a plain directory,
served by path, so no hub cache or network is involved.

Writing it needs `tokenizers`, `torch` and `transformers`: `ensure_tiny_model`
runs this file as a script under a release environment's Python.
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ci.hf_standin import Vocabulary, write_random_weights, write_tokenizer
from vllm_overlay.errors import OverlayError
from vllm_overlay.locking import exclusive

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "bos_token_id": 0,
    "eos_token_id": 1,
    "hidden_act": "silu",
    "hidden_size": 256,
    "intermediate_size": 512,
    "max_position_embeddings": 2048,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 2048,
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


def model_digest() -> str:
    """Changes whenever the checkpoint would."""
    payload = json.dumps([CONFIG, repr(VOCABULARY)], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def ensure_tiny_model(target: Path, python: Path) -> Path:
    """The checkpoint in `target`, written (with `python`) unless current."""
    stamp = target / STAMP
    if stamp.is_file() and stamp.read_text().strip() == model_digest():
        return target
    with exclusive(target.parent):
        if stamp.is_file() and stamp.read_text().strip() == model_digest():
            return target
        proc = subprocess.run(
            [str(python), str(Path(__file__).resolve()), str(target)], check=False
        )
        if proc.returncode:
            raise OverlayError(f"writing the tiny model into {target} failed")
    return target


def write_tiny_model(target: Path) -> None:
    """Write the checkpoint beside `target` and move it in whole."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".building-") as tmp:
        staging = Path(tmp) / "model"
        staging.mkdir()
        (staging / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
        write_tokenizer(staging, VOCABULARY)
        write_random_weights(staging)
        (staging / STAMP).write_text(model_digest() + "\n")
        if target.exists():
            os.replace(target, Path(tmp) / "old")
        os.replace(staging, target)


if __name__ == "__main__":
    write_tiny_model(Path(sys.argv[1]))
