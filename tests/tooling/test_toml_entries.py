"""A release's one-line entry added to a hand-kept table, every other byte
kept (`common/toml_entries.py`: `pin` records the release facts with it)."""

from vllm_overlay.common.toml_entries import with_release_entry

FACTS = """\
# The facts.
[platform]
"0.22.1" = { python = "a" }
# About 0.32.0.
"0.32.0" = { python = "c" }

[other]
x = 1
"""


def test_the_entry_goes_in_release_order_before_a_later_ones_comments():
    text, line = with_release_entry(
        FACTS, "platform", "0.30.0", '"0.30.0" = { python = "b" }', {"python": "b"}
    )
    assert text.splitlines()[3:6] == [
        '"0.30.0" = { python = "b" }',
        "# About 0.32.0.",
        '"0.32.0" = { python = "c" }',
    ]
    assert line == 4
    assert text.replace('"0.30.0" = { python = "b" }\n', "") == FACTS


def test_a_newest_entry_goes_after_the_tables_last_line_with_its_comment():
    text, line = with_release_entry(
        FACTS,
        "platform",
        "0.34.0",
        '"0.34.0" = { python = "d" }',
        {"python": "d"},
        "Recorded by hand.",
    )
    lines = text.splitlines()
    assert lines[5:8] == ["# Recorded by hand.", '"0.34.0" = { python = "d" }', ""]
    assert line == 7


def test_a_file_without_the_table_or_an_entry_that_does_not_say_the_value_is_refused():
    entry = '"0.30.0" = { python = "b" }'
    assert with_release_entry(FACTS, "test_env.x", "0.30.0", entry, {}) is None
    assert (
        with_release_entry(FACTS, "platform", "0.30.0", entry, {"python": "z"}) is None
    )
    assert (
        with_release_entry(FACTS, "platform", "0.22.1", entry, {"python": "b"}) is None
    )
