"""Times, on a decode server, what `nixl-decode-confirms-reads`' question
before a read costs a pulled request: from the engine's input thread
receiving it (`EngineCore.preprocess_add_request`, where the question
leaves) to the scheduler adding it (`on_new_request`, where it left before
`hybridkv.20` of 0.32.0), the question (`_question`) and its answer's
arrival (the asking thread's future completing), and the attempt to
schedule the request that took the answer up (`_remote_blocks_still_held`
returning other than None), with how many attempts found no answer before
it. Each such request becomes one JSON line in a file of its process under
the folder given to `install`.

Not part of the product: `pd_question_timing.py` beside it puts this file
into an environment of its own, with a `.pth` line that calls `install`.
It wraps the patched NIXL scheduler's private methods as every pinned
release's series names them, when their modules are imported, so that
`install` itself imports nothing of vLLM; the benchmark fails when a run
recorded nothing.
"""

import importlib.abc
import importlib.machinery
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ENGINE_CORE = "vllm.v1.engine.core"
NIXL = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"
# The decode side's question lives in the pull scheduler from 0.30.0 on, and
# in the one NIXL scheduler module before.
SCHEDULERS = (f"{NIXL}.pull_scheduler", f"{NIXL}.scheduler")


class _Timings:
    """One decode process's requests in flight, by request id, and where
    their lines go."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / f"{os.getpid()}.jsonl"
        self.requests: dict[str, dict[str, Any]] = {}

    def received(self, request_id: str) -> None:
        self.requests[request_id] = {
            "received": time.monotonic(),
            "attempts_before": 0,
        }

    def taken_up(self, request_id: str, held: bool) -> None:
        timing = self.requests.pop(request_id, None)
        if timing is None or "asked" not in timing:
            return
        timing.update(taken_up=time.monotonic(), held=held)
        with self.path.open("a") as out:
            out.write(json.dumps(timing) + "\n")


def _patch_engine_core(module: ModuleType, timings: _Timings) -> None:
    preprocess = module.EngineCore.preprocess_add_request

    def preprocess_add_request(self, request):
        # Before the patched build's question, which leaves from here.
        timings.received(request.request_id)
        return preprocess(self, request)

    module.EngineCore.preprocess_add_request = preprocess_add_request


def _patch_scheduler(module: ModuleType, timings: _Timings) -> None:
    patched = [
        cls
        for cls in vars(module).values()
        if isinstance(cls, type)
        and cls.__module__ == module.__name__
        and "_remote_blocks_still_held" in vars(cls)
    ]
    for cls in patched:
        _patch_scheduler_class(cls, timings)


def _patch_scheduler_class(cls: type, timings: _Timings) -> None:
    on_new_request = cls.on_new_request
    question = cls._question
    still_held = cls._remote_blocks_still_held

    def timed_on_new_request(self, request):
        timing = timings.requests.setdefault(
            request.request_id, {"received": None, "attempts_before": 0}
        )
        timing["added"] = time.monotonic()
        on_new_request(self, request)
        if "asked" not in timing:
            # Nothing to pull (a prefill server's request, a local hit).
            timings.requests.pop(request.request_id, None)

    def timed_question(self, request):
        timing = timings.requests.get(request.request_id)
        asked = time.monotonic()
        held_answer = question(self, request)
        if timing is None or "asked" in timing:
            return held_answer
        timing["asked"] = asked

        def answered(_future: object) -> None:
            # Runs just after the future is done, so a line written in
            # between has no "answered": the table leaves it out there.
            timing["answered"] = time.monotonic()

        held_answer.answer.add_done_callback(answered)
        return held_answer

    def timed_still_held(self, request):
        held = still_held(self, request)
        timing = timings.requests.get(request.request_id)
        if held is None:
            if timing is not None:
                timing["attempts_before"] += 1
        else:
            timings.taken_up(request.request_id, held)
        return held

    cls.on_new_request = timed_on_new_request
    cls._question = timed_question
    cls._remote_blocks_still_held = timed_still_held


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds the modules to time as Python would, and patches each once its
    code ran."""

    def __init__(
        self,
        patches: dict[str, Callable[[ModuleType, _Timings], None]],
        timings: _Timings,
    ) -> None:
        self.patches = patches
        self.timings = timings

    def find_spec(self, name, path, target=None):
        patch = self.patches.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module
        timings = self.timings

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            patch(module, timings)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


def install(folder: str) -> None:
    """Time the questions of this process's decode scheduler into `folder`.
    Idempotent: a virtualenv's site-packages may be read twice (`lib64`
    links to `lib`), and with it the `.pth` line that calls this."""
    if any(isinstance(finder, _PatchOnImport) for finder in sys.meta_path):
        return
    timings = _Timings(Path(folder))
    patches = {ENGINE_CORE: _patch_engine_core}
    patches.update(dict.fromkeys(SCHEDULERS, _patch_scheduler))
    sys.meta_path.insert(0, _PatchOnImport(patches, timings))
