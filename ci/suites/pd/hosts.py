"""The hosts the P/D cases pin their servers to (a case's `env`), so that a
case gives the same result on every machine of this kind, with AMX tiles or
without (`ci/suites/pd/cases.py` says which case takes which, and why).

`no_amx/sitecustomize.py` makes vLLM see no AMX tiles; oneDNN is capped
below AMX by its own variable. A host without AMX is unchanged by either.
"""

from pathlib import Path

NO_AMX_DIR = Path(__file__).parent / "no_amx"

# 0.22.1's Qwen3-Next cases (case 6): no AMX tiles, the conv state
# dim-first, as a user on a CPU without AMX runs them.
NO_AMX_DIM_FIRST = {
    "PYTHONPATH": str(NO_AMX_DIR),
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
    "PYTHONPATH": str(NO_AMX_DIR),
    "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",
}
