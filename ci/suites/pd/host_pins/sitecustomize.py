"""The host pins of the servers the suites start (`ci/suites/pd/hosts.py`
says which server takes which, and why): each pin named in
VLLM_OVERLAY_HOST_PINS changes one module as it is first imported, so that
the servers give the same result on every CPU of this kind.

- `no-amx-tiles` makes `torch.cpu._is_amx_tile_supported()` answer False,
  which is where every AMX decision of vLLM 0.22.1's Python code is made:
  the CPU platform's forced `VLLM_SSM_CONV_STATE_LAYOUT=SD` and its
  switching off of prefix caching for linear attention
  (vllm/platforms/cpu.py:150-162, 229-231 there), and the Gated DeltaNet
  kernel's choice of its AMX path
  (model_executor/layers/mamba/ops/cpu/gdn_attention.py:59-60). A host with
  AMX then serves as a host without.
- `moe-silu-static` mends vLLM 0.22.1's CPU mixture-of-experts fallback,
  which a CPU without AVX-512 takes (its `_C_AVX2` kernels have no
  `prepack_moe_weight`: model_executor/layers/fused_moe/cpu_fused_moe.py:
  286-287 there). Its activation table means to hold static functions, so
  that no CustomOp is built outside a vLLM config (the comment at :49-51),
  but its SiLU entry builds `SiluAndMul` at every call (:53), and the engine
  dies in its first profile run with "Current vLLM config is not set". The
  pin puts the static `SiluAndMul.forward_native` in its place: the same
  computation, as that comment intends. Without AVX-512 a tiny Qwen3-Next
  (every layer a MoE) then starts as it does with AVX-512, where the fused
  kernel never reads the table.

Python runs this module at start-up when its directory is on PYTHONPATH, and
spawned engine cores inherit both variables. Nothing is imported here: vLLM
sets environment variables before its first import of torch
(vllm/env_override.py), so each module is changed as it is loaded, by a
finder that steps aside once it has done so. A pin name this module does
not know, or none, stops the process.
"""

import os
import sys
from collections.abc import Callable
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec, PathFinder
from types import ModuleType

PINS_VARIABLE = "VLLM_OVERLAY_HOST_PINS"


def no_amx_tiles() -> bool:
    return False


def hide_amx_tiles(module: ModuleType) -> None:
    module._is_amx_tile_supported = no_amx_tiles


def static_silu(module: ModuleType) -> None:
    table = module._CPU_MOE_ACT_FN
    table[module.MoEActivation.SILU] = module.SiluAndMul.forward_native


# Pin name: (the module it changes, the change, made once the module ran).
PINS: dict[str, tuple[str, Callable[[ModuleType], None]]] = {
    "no-amx-tiles": ("torch.cpu", hide_amx_tiles),
    "moe-silu-static": (
        "vllm.model_executor.layers.fused_moe.cpu_fused_moe",
        static_silu,
    ),
}


class ChangeOnLoad(MetaPathFinder):
    """Finds `name` as the path finder does, and has its loader run
    `change` on the module once the module itself has run."""

    def __init__(self, name: str, change: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.change = change

    def find_spec(
        self,
        fullname: str,
        path: "list[str] | None",
        target: "ModuleType | None" = None,
    ) -> "ModuleSpec | None":
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module
        change = self.change

        def run_and_change(module: ModuleType) -> None:
            run_module(module)
            change(module)

        spec.loader.exec_module = run_and_change  # type: ignore[method-assign]
        return spec


def install(names: list[str]) -> None:
    unknown = [name for name in names if name not in PINS]
    if unknown or not names:
        # site.py reports an exception here and goes on: a server on a host
        # not pinned as its caller meant would prove nothing, so it stops.
        sys.stderr.write(
            f"{PINS_VARIABLE}={' '.join(names)!r}: name host pins of {sorted(PINS)}\n"
        )
        sys.stderr.flush()
        os._exit(2)
    for name in names:
        sys.meta_path.insert(0, ChangeOnLoad(*PINS[name]))


install(os.environ.get(PINS_VARIABLE, "").split())
