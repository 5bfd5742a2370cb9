"""The benchmark-only hook that times the decode side's question before a
read (`benchmarks/investigations/read_question_timing.py`): the patched NIXL scheduler's
methods it wraps are stood in for by a class with the same names, since the
real ones run only inside a decode server (the benchmark itself fails when a
real run recorded nothing); and the benchmark's table row that reads its
lines."""

import json
import sys
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from benchmarks.investigations import read_question_timing as hook
from benchmarks.investigations.pd_question_timing import row


class _Scheduler:
    """What `nixl-decode-confirms-reads` gives the pull scheduler: a question
    asked as the request reaches the scheduler unless the engine's input
    thread asked it already, and attempts that find no answer (None) until
    it came."""

    def __init__(self, answer: Future) -> None:
        self.answer = answer
        self._held_answers = {}

    def on_request_received(self, request):
        self._held_answers[request.request_id] = self._question(request)

    def on_new_request(self, request):
        if request.request_id not in self._held_answers:
            self._held_answers[request.request_id] = self._question(request)

    def _question(self, request):
        return SimpleNamespace(answer=self.answer)

    def _remote_blocks_still_held(self, request):
        return True if self.answer.done() else None


class _LocalScheduler(_Scheduler):
    def on_new_request(self, request):
        """A request with nothing to pull asks nothing."""


class _EngineCore:
    """The engine core's input thread: it makes the engine's request and,
    patched, asks as it receives it."""

    def __init__(self, scheduler: _Scheduler, on_receipt: bool) -> None:
        self.scheduler = scheduler
        self.on_receipt = on_receipt

    def preprocess_add_request(self, request):
        if self.on_receipt:
            self.scheduler.on_request_received(request)
        return request, 0


def _timed(tmp_path, scheduler_base: type, answer: Future, on_receipt: bool):
    timings = hook._Timings(tmp_path)
    scheduler_class = type("Scheduler", (scheduler_base,), {})
    hook._patch_scheduler_class(scheduler_class, timings)
    engine_module = SimpleNamespace(EngineCore=type("EngineCore", (_EngineCore,), {}))
    hook._patch_engine_core(engine_module, timings)
    scheduler = scheduler_class(answer)
    return timings, scheduler, engine_module.EngineCore(scheduler, on_receipt)


@pytest.mark.parametrize(
    ("on_receipt", "order"),
    [
        (False, ["received", "added", "asked", "answered", "taken_up"]),
        (True, ["received", "asked", "added", "answered", "taken_up"]),
    ],
)
def test_a_pulled_request_becomes_one_line_with_its_times_in_order(
    tmp_path, on_receipt, order
):
    answer: Future = Future()
    timings, scheduler, engine = _timed(tmp_path, _Scheduler, answer, on_receipt)
    request = SimpleNamespace(request_id="req-1")

    engine.preprocess_add_request(request)
    scheduler.on_new_request(request)
    assert scheduler._remote_blocks_still_held(request) is None
    assert not timings.path.exists()
    answer.set_result({"remote": 5.0})
    assert scheduler._remote_blocks_still_held(request) is True

    [line] = timings.path.read_text().splitlines()
    timing = json.loads(line)
    assert timing["attempts_before"] == 1
    assert timing["held"] is True
    assert [timing[key] for key in order] == sorted(timing[key] for key in order)


def test_a_request_that_never_asked_writes_nothing_and_is_forgotten(tmp_path):
    done: Future = Future()
    done.set_result({})
    timings, scheduler, engine = _timed(tmp_path, _LocalScheduler, done, False)
    request = SimpleNamespace(request_id="local")

    engine.preprocess_add_request(request)
    scheduler.on_new_request(request)
    assert timings.requests == {}
    assert scheduler._remote_blocks_still_held(request) is True
    assert not timings.path.exists()


def test_install_patches_a_named_module_once_it_ran(tmp_path, monkeypatch):
    package = tmp_path / "timed_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "scheduler.py").write_text(
        "class Scheduler:\n"
        "    def on_new_request(self, request): pass\n"
        "    def _question(self, request): pass\n"
        "    def _remote_blocks_still_held(self, request): return None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setattr(hook, "SCHEDULERS", ("timed_pkg.scheduler",))

    hook.install(str(tmp_path))
    hook.install(str(tmp_path))
    finders = [f for f in sys.meta_path if isinstance(f, hook._PatchOnImport)]
    try:
        from timed_pkg.scheduler import Scheduler

        assert len(finders) == 1
        assert Scheduler.on_new_request.__name__ == "timed_on_new_request"
    finally:
        for name in ("timed_pkg.scheduler", "timed_pkg"):
            sys.modules.pop(name, None)


def test_the_tables_row_counts_a_request_received_at_time_zero():
    """`benchmarks/investigations/pd_question_timing.py` reads the hook's lines: a
    receipt at time 0.0 is a receipt, and a cell with none left prints nan."""
    line = {"received": 0.0, "added": 0.004, "asked": 0.004, "answered": 0.006}
    line.update(taken_up=0.011, attempts_before=0, held=True)
    runs = [
        SimpleNamespace(bench=SimpleNamespace(median_ttft_s=0.1, median_tpot_s=0.007))
    ]

    cells = row(4, "NixlConnector", [line], runs).split(" | ")
    assert cells[3] == "4.0 / 4.0 ms"
    assert cells[6:8] == ["0%", "100%"]
    unstamped = row(4, "NixlConnector", [dict(line, received=None)], runs)
    assert unstamped.split(" | ")[3] == "nan / nan ms"
