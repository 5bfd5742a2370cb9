"""What NIXL's compatibility hash covers for one launch, and where two
launches differ in it.

The two servers of a prefill/decode pair exchange a hash of their
configurations when the decode server first reads from the prefill server,
and a mismatch fails that request and every later one ("NIXL compatibility
hash mismatch"). Doctor asks the installed vLLM's own function
(`compute_nixl_compatibility_hash`, nixl/metadata.py) for the factors it
hashes, so that the comparison covers what this release covers: 0.30.0 to
0.33.0 hash the speculative config of EAGLE-style methods (MTP included),
0.22.1 none. The function hashes the factors with `hash_factors`, which
doctor replaces while it runs to keep the factors themselves.

Two factors come from the worker, which doctor does not build: the attention
backend's name (doctor names the backend vLLM's selector picks for the
model, the same way for both launches) and, in 0.22.1,
`cross_layers_blocks` (a KV cache layout choice, taken as the same on both).
"""

import importlib
import inspect
from collections.abc import Mapping
from typing import Any
from unittest import mock

from vllm_overlay.doctor.facts import FactorDifference

NIXL_METADATA = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata"
SPECULATIVE = "speculative_config"


def compatibility_factors(config: Any, backend: str) -> dict[str, Any] | None:
    """The factors `compute_nixl_compatibility_hash` hashes for `config`;
    None when this vLLM has no such function or it fails on the config."""
    try:
        compute = importlib.import_module(NIXL_METADATA).compute_nixl_compatibility_hash
        from vllm.config import utils as config_utils
    except Exception:  # a release without it, a package that does not import
        return None
    captured: dict[str, Any] = {}

    def keep(factors: dict[str, Any]) -> str:
        captured.update(factors)
        return ""

    extra = {}
    if "cross_layers_blocks" in inspect.signature(compute).parameters:
        extra["cross_layers_blocks"] = False
    try:
        with mock.patch.object(config_utils, "hash_factors", keep):
            compute(config, backend, **extra)
    except Exception:  # private internals: any failure means "not known"
        return None
    return captured


def differences(
    here: Mapping[str, Any], peer: Mapping[str, Any]
) -> tuple[FactorDifference, ...]:
    """The factors that differ, the speculative config's first (one entry a
    field when both sides have one)."""
    found = []
    names = [*here, *(name for name in peer if name not in here)]
    for name in sorted(names, key=lambda name: name != SPECULATIVE):
        mine, theirs = here.get(name), peer.get(name)
        if mine == theirs:
            continue
        if isinstance(mine, Mapping) and isinstance(theirs, Mapping):
            found += [
                FactorDifference(f"{name}.{d.name}", d.here, d.peer)
                for d in differences(mine, theirs)
            ]
        else:
            found.append(FactorDifference(name, _text(mine), _text(theirs)))
    return tuple(found)


def _text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {_text(v)}" for k, v in value.items() if v is not None)
    return repr(value) if isinstance(value, str) else str(value)
