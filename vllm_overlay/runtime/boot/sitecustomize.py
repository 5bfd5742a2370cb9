"""Installs the `vllm-overlay serve` overlay in a Python process at start-up.

`vllm-overlay serve` puts this directory first on `PYTHONPATH`, so `site`
imports this module in every process started from it, before `__main__` runs
(see `vllm_overlay/runtime/propagate.py`). It must work where vllm-overlay is
not importable by itself (the serving process may have found it through a
path its children do not get), so it imports it from the tree it lives in,
without leaving that tree on `sys.path`. Any failure ends the process with a
one-line reason: a spawned engine process running unpatched code next to a
patched one is worse than one that does not start.

This directory shadows any other `sitecustomize`, so the next one on
`sys.path` is run afterwards, as Python would have run it.
"""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_TREE = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))


def _activate() -> None:
    sys.path.insert(0, _TREE)
    try:
        from vllm_overlay.runtime.propagate import activate_from_environment
    finally:
        sys.path.remove(_TREE)
    activate_from_environment()


def _run_next_sitecustomize() -> None:
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _activate()
except Exception as exc:
    reason = " ".join(f"{type(exc).__name__}: {exc}".split())
    sys.stderr.write(f"vllm-overlay: error: process {os.getpid()}: {reason}\n")
    sys.stderr.flush()
    os._exit(1)
_run_next_sitecustomize()
