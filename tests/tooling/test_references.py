"""How `rebase` moves a patch message's `path:line` references
(`track/rebasing/references.py`), on files held in memory."""

from vllm_overlay.track.rebasing.references import retarget_series

SCHED = "vllm/v1/core/sched/scheduler.py"
OTHER = "vllm/other/scheduler.py"
OLD = {
    SCHED: "".join(f"line {n}\n" for n in range(1, 11)) + ")\n" * 3,
    OTHER: "a\nb\n",
}
NEW = {
    SCHED: "new\n" * 2 + "".join(f"line {n}\n" for n in range(1, 11)) + ")\n" * 3,
    OTHER: "a\nb\n",
}


def moved(message: str, old=OLD, new=NEW):
    data = f"From x\nSubject: s\n\n{message}\n---\n diff\n".encode()
    out, refs = retarget_series(
        {"p.patch": data},
        list(old),
        lambda path: old.get(path, "").encode(),
        lambda path: new.get(path, "").encode(),
    )
    text = out["p.patch"].decode().partition("\n---\n")[0].split("\n\n", 1)[1]
    return text, [(r.cited, r.moved_to or f"stale: {r.stale}") for r in refs]


def test_a_reference_follows_its_lines():
    assert moved("see sched/scheduler.py:3-4 here") == (
        "see sched/scheduler.py:5-6 here",
        [("sched/scheduler.py:3-4", "sched/scheduler.py:5-6")],
    )


def test_a_bare_line_is_in_the_file_cited_last():
    text, _ = moved("in sched/scheduler.py:3, then (:7) and\n:8-9.")
    assert text == "in sched/scheduler.py:5, then (:9) and\n:10-11."


def test_a_short_path_of_several_files_takes_the_one_named_before():
    assert moved("v1/core/sched/scheduler.py:1; scheduler.py:2")[0] == (
        "v1/core/sched/scheduler.py:3; scheduler.py:4"
    )
    assert moved("scheduler.py:2") == (
        "scheduler.py:2",
        [("scheduler.py:2", "stale: 2 files of vLLM end so")],
    )


def test_lines_that_are_gone_are_stale():
    new = {**NEW, SCHED: NEW[SCHED].replace("line 4\n", "changed\n")}
    assert moved("sched/scheduler.py:4", new=new) == (
        "sched/scheduler.py:4",
        [("sched/scheduler.py:4", "stale: the cited lines are no longer there")],
    )


def test_code_that_only_gained_or_lost_blank_lines_moves_to_its_new_span():
    """0.31.0's `get_computed_blocks_for_connector` is 0.30.0's with one
    blank line more: the same code, cited by its new span."""
    spaced = NEW[SCHED].replace("line 4\n", "line 4   \n\n")
    assert moved("sched/scheduler.py:3-5", new={**NEW, SCHED: spaced}) == (
        "sched/scheduler.py:5-8",
        [("sched/scheduler.py:3-5", "sched/scheduler.py:5-8")],
    )
    old = {**OLD, SCHED: OLD[SCHED].replace("line 4\n", "line 4\n\n")}
    assert moved("sched/scheduler.py:3-6", old=old)[0] == "sched/scheduler.py:5-7"


def test_blank_lines_found_twice_or_at_a_ranges_edge_are_stale():
    spaced = "line 2\n\nline 3\n"
    twice = NEW[SCHED].replace("line 2\nline 3\n", spaced) + spaced
    assert moved("sched/scheduler.py:2-3", new={**NEW, SCHED: twice})[1] == [
        ("sched/scheduler.py:2-3", "stale: the cited lines are there 2 times")
    ]
    old = {**OLD, SCHED: OLD[SCHED].replace("line 4\n", "\n")}
    spaced = {**NEW, SCHED: NEW[SCHED].replace("line 4\n", " \n\n")}
    assert moved("sched/scheduler.py:3-4", old=old, new=spaced)[1] == [
        ("sched/scheduler.py:3-4", "stale: the cited lines are no longer there")
    ]


PY = "vllm/v1/core/kv_cache_manager.py"
PY_OLD = (
    "class A:\n    def f(self):\n        return 1\n\n"
    "    def g(self):\n        return 2\n"
)
PY_NEW = (
    "import x\n\n\nclass A:\n    def g(self):\n        return 3\n\n"
    "    def f(self):\n        y = 2\n        return y\n"
)


def test_a_whole_definition_follows_it_when_its_code_changed():
    """The range of 0.31.0's `_send_heartbeats`, whose body 0.30.0 words
    otherwise, cites 0.30.0's `_send_heartbeats`, flagged for review."""
    old, new = {PY: PY_OLD}, {PY: PY_NEW}
    data = b"From x\nSubject: s\n\nsee kv_cache_manager.py:2-3 and :5-6\n---\n"
    out, refs = retarget_series(
        {"p.patch": data},
        [PY],
        lambda path: old.get(path, "").encode(),
        lambda path: new.get(path, "").encode(),
    )
    assert b"see kv_cache_manager.py:8-10 and :5-6\n" in out["p.patch"]
    assert [(r.cited, r.moved_to, r.changed) for r in refs] == [
        ("kv_cache_manager.py:2-3", "kv_cache_manager.py:8-10", "A.f"),
        (":5-6", ":5-6", "A.g"),
    ]


def test_a_range_that_is_not_one_whole_definition_stays_stale():
    old, new = {PY: PY_OLD}, {PY: PY_NEW}
    for cited in ("kv_cache_manager.py:3-4", "kv_cache_manager.py:3-6"):
        assert moved(cited, old=old, new=new)[1] == [
            (cited, "stale: the cited lines are no longer there")
        ]
    twice = {PY: PY_NEW + "\n\nclass A:\n    def f(self):\n        pass\n"}
    assert moved("kv_cache_manager.py:2-3", old=old, new=twice)[1] == [
        ("kv_cache_manager.py:2-3", "stale: the cited lines are there 2 times")
    ]


def test_lines_still_at_their_numbers_stay_where_the_same_lines_recur():
    assert moved("other/scheduler.py:1 and sched/scheduler.py:12") == (
        "other/scheduler.py:1 and sched/scheduler.py:12",
        [("sched/scheduler.py:12", "stale: the cited lines are there 3 times")],
    )
    same = {**NEW, SCHED: OLD[SCHED]}
    assert moved("sched/scheduler.py:12", new=same) == ("sched/scheduler.py:12", [])


def test_a_line_naming_a_release_and_files_outside_vllm_are_left_alone():
    message = "sched/scheduler.py:3 in 0.31.0\n:4 too\nlmcache/x.py:3"
    assert moved(message) == (message, [])


def test_a_reference_to_upstreams_tests_moves_and_a_short_path_means_the_package():
    """Upstream's tests (cited by their whole `tests/...` path) move like the
    package's files; a short path never resolves to a test file."""
    test = "tests/v1/kv_connector/unit/utils.py"
    old = {**OLD, test: "a\nconnector = Mock()\nreturn connector\n"}
    new = {**NEW, test: "a\nb\nc\nconnector = Mock()\nreturn connector\n"}
    assert moved(f"see {test}:2-3, not unit/utils.py:2", old=old, new=new) == (
        f"see {test}:4-5, not unit/utils.py:2",
        [(f"{test}:2-3", f"{test}:4-5")],
    )
    gone = {**new, test: "a\n"}
    assert moved(f"{test}:2", old=old, new=gone)[1] == [
        (f"{test}:2", "stale: the cited lines are no longer there")
    ]
