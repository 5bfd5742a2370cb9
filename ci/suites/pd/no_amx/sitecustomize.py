"""Hides a CPU's AMX tiles from vLLM: the host pin of the P/D cases that
serve a Gated DeltaNet hybrid over NIXL (`ci/suites/pd/hosts.py` says which,
and why; below, what it changes on vLLM 0.22.1).

Python runs this module at start-up when its directory is on PYTHONPATH, as
it is in those servers' environments, and their spawned engine cores
inherit it. It makes `torch.cpu._is_amx_tile_supported()` answer False,
which is where every AMX decision of vLLM 0.22.1's Python code is made: the
CPU platform's forced `VLLM_SSM_CONV_STATE_LAYOUT=SD` and its switching off
of prefix caching for linear attention (vllm/platforms/cpu.py:150-162,
229-231 there), and the Gated DeltaNet kernel's choice of its AMX path
(model_executor/layers/mamba/ops/cpu/gdn_attention.py:59-60). A host with
AMX then serves as a host without, and the cases give the same result on
both kinds.

Torch is not imported here: vLLM sets environment variables before its
first import of torch (vllm/env_override.py), so the answer is replaced as
`torch.cpu` is loaded, by a finder that steps aside once it has done so.
"""

import sys
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec, PathFinder
from types import ModuleType

MODULE = "torch.cpu"


def no_amx_tiles() -> bool:
    return False


class HideAmxTiles(MetaPathFinder):
    """Finds `torch.cpu` as the path finder does, and has its loader replace
    `_is_amx_tile_supported` once the module has run."""

    def find_spec(
        self,
        fullname: str,
        path: "list[str] | None",
        target: "ModuleType | None" = None,
    ) -> "ModuleSpec | None":
        if fullname != MODULE:
            return None
        sys.meta_path.remove(self)
        spec = PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def run_and_hide(module: ModuleType) -> None:
            run_module(module)
            module._is_amx_tile_supported = no_amx_tiles

        spec.loader.exec_module = run_and_hide  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, HideAmxTiles())
