"""The hosts the suites pin their servers to (a P/D case's `env`, the serve
suite's hybrid), so that a server gives the same result on every machine of
this kind: with AMX tiles or without, with AVX-512 or without
(`ci/suites/pd/cases.py` says which case takes which, and why).

`host_pins/sitecustomize.py` changes a module of the server's as it loads,
for each pin its environment names (`pinned`); oneDNN is capped below AMX by
its own variable. A host that lacks what a pin hides is unchanged by it.
"""

from pathlib import Path

PINS_DIR = Path(__file__).parent / "host_pins"
# Read by host_pins/sitecustomize.py, which names its pins in PINS.
PINS_VARIABLE = "VLLM_OVERLAY_HOST_PINS"
NO_AMX_TILES = "no-amx-tiles"
MOE_SILU_STATIC = "moe-silu-static"


def pinned(*pins: str) -> dict[str, str]:
    """The environment variables that pin a server's host with `pins`."""
    return {"PYTHONPATH": str(PINS_DIR), PINS_VARIABLE: " ".join(pins)}


# vLLM 0.22.1's tiny Qwen3-Next, every layer a mixture of experts: on a CPU
# without AVX-512, 0.22.1's MoE fallback builds a CustomOp outside a vLLM
# config and the engine dies at start-up; the pin gives its activation table
# the static function it means to hold (host_pins/sitecustomize.py says
# where). On a CPU with AVX-512 the fused kernel never reads that table.
QWEN3_NEXT_MOE = pinned(MOE_SILU_STATIC)

# 0.22.1's Qwen3-Next cases (case 6): no AMX tiles, the conv state
# dim-first, as a user on a CPU without AMX runs them, and its MoE as above.
NO_AMX_DIM_FIRST = {
    **pinned(NO_AMX_TILES, MOE_SILU_STATIC),
    "VLLM_SSM_CONV_STATE_LAYOUT": "DS",
}

# The e2e release's bfloat16 hybrids (HYBRID, MTP): no AMX tiles, for vLLM
# (the attention backend it picks) and for oneDNN (ONEDNN_MAX_CPU_ISA, its
# matmul kernels). On a CPU with AMX their kernels round a request's logits
# otherwise as the batch around it changes: the load runs' outputs parted
# from the unpatched run of the same P/D path in 2 to 4 requests of 48, on
# every build and differently each run (2026-12-07, 0.32.0, alone on the
# machine); pinned, 48 of 48 were equal, as on CPUs without AMX.
NO_AMX = {
    **pinned(NO_AMX_TILES),
    "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",
}
