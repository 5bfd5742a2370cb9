"""An offline stand-in for the Hugging Face hub, for upstream's unit tests.

Upstream's tests name hub model ids; vLLM reads each id's config (and often its
tokenizer) while building a `VllmConfig`, so with the hub out of reach
(`HF_HUB_OFFLINE=1`) the tests fail before testing anything. This module writes
a hub cache (`$HF_HOME/hub/models--ORG--NAME/...`, the layout `huggingface_hub`
reads offline) in which every id answers with:

- the public `config.json` values of that model, kept as data in
  `patches/vllm/hf-standins.json` (`load_standins` checks it);
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

from vllm_overlay import atomic
from vllm_overlay.errors import OverlayError, exit_status
from vllm_overlay.locations import REPO_ROOT
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


# Every model id that the upstream tests we run name (see
# `ci/upstream_tests.py`), as data. Only distilgpt2 carries weights: it is the
# one model with which a test that runs here starts an engine
# (test_engine_logger_apis). Qwen/Qwen3.5-0.8B is named only by
# test_hybrid_prefix_cache_hit_rate.py, which needs the real checkpoint and is
# deselected (ci/deselected.toml).
STANDINS_FILE = REPO_ROOT / "patches" / "vllm" / "hf-standins.json"
_VOCABULARY_KEYS = {"size", "specials", "bos", "eos", "unk", "pad", "add_bos"}
_STANDIN_KEYS = {"repo_id", "vocabulary", "config", "extra_files", "random_weights"}


def load_standins(path: Path = STANDINS_FILE) -> tuple[StandIn, ...]:
    """The stand-ins of `path`, checked; a defect is one `OverlayError` line
    naming the file and the entry."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise OverlayError(f"cannot load {path}: {exc}") from None
    if not isinstance(data, dict) or set(data) != {"about", "vocabularies", "standins"}:
        raise OverlayError(f"{path}: needs exactly about, vocabularies, standins")
    vocabularies = {
        name: _vocabulary(path, name, entry)
        for name, entry in _mapping(path, "vocabularies", data["vocabularies"]).items()
    }
    if not isinstance(data["standins"], list) or not data["standins"]:
        raise OverlayError(f"{path}: standins must be a non-empty list")
    return tuple(_standin(path, entry, vocabularies) for entry in data["standins"])


def _mapping(path: Path, where: str, value: object) -> dict:
    if not isinstance(value, dict):
        raise OverlayError(f"{path}: {where} must be an object")
    return value


def _vocabulary(path: Path, name: str, entry: object) -> Vocabulary:
    entry = _mapping(path, f"vocabulary {name}", entry)
    unknown = set(entry) - _VOCABULARY_KEYS
    size, specials = entry.get("size"), entry.get("specials")
    if unknown or not isinstance(size, int) or not isinstance(specials, dict):
        raise OverlayError(
            f"{path}: vocabulary {name} needs an integer size and a specials "
            f"object (and no keys but {', '.join(sorted(_VOCABULARY_KEYS))})"
        )
    try:
        by_id = {int(token_id): token for token_id, token in specials.items()}
    except ValueError:
        raise OverlayError(
            f"{path}: vocabulary {name}: a special's id is not an integer"
        ) from None
    named = {key: entry.get(key) for key in ("bos", "eos", "unk", "pad")}
    missing = [
        f"{key} {token}"
        for key, token in named.items()
        if token is not None and token not in by_id.values()
    ]
    if missing:
        raise OverlayError(
            f"{path}: vocabulary {name}: {', '.join(missing)} is not a special"
        )
    return Vocabulary(size, by_id, **named, add_bos=entry.get("add_bos", False) is True)


def _standin(path: Path, entry: object, vocabularies: dict[str, Vocabulary]) -> StandIn:
    entry = _mapping(path, "a stand-in", entry)
    repo_id = entry.get("repo_id")
    where = f"stand-in {repo_id}"
    if not isinstance(repo_id, str) or set(entry) - _STANDIN_KEYS:
        raise OverlayError(
            f"{path}: {where}: needs a repo_id (and no keys but "
            f"{', '.join(sorted(_STANDIN_KEYS))})"
        )
    if entry.get("vocabulary") not in vocabularies:
        raise OverlayError(
            f"{path}: {where}: unknown vocabulary {entry.get('vocabulary')!r}"
        )
    return StandIn(
        repo_id,
        _mapping(path, f"{where}: config", entry.get("config")),
        vocabularies[entry["vocabulary"]],
        _mapping(path, f"{where}: extra_files", entry.get("extra_files", {})),
        entry.get("random_weights", False) is True,
    )


STANDINS = load_standins()


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
    """Run this module under `python` (`python -m ci.hf_standin HF_HOME`),
    from the repository root: the environment has neither `ci` nor
    `vllm_overlay` installed, so they must import from this checkout. The
    paths are absolute, since the child does not run in the caller's working
    directory."""
    command = [str(python.absolute()), "-m", "ci.hf_standin"]
    proc = subprocess.run(
        [*command, str(hf_home.absolute())], cwd=REPO_ROOT, check=False
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
        print("usage: python -m ci.hf_standin HF_HOME", file=sys.stderr)
        return 2
    write_hf_standin(Path(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(exit_status(main))
