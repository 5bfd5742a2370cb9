"""How `rebase` moves a patch message's `path:line` references
(`track/references.py`), on files held in memory."""

from vllm_overlay.track.references import retarget_series

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
