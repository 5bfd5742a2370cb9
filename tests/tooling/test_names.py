"""`track/checks/names.py`: the global names a series makes a module read that the
module never binds, judged by Python's symbol tables against the unpatched
file."""

import pytest

from vllm_overlay.track.checks.names import Unjudged, new_unbound_names, unbound_globals

NAME = "vllm/demo.py"


def unbound(source: str) -> set[str]:
    return unbound_globals(source.encode(), NAME)


@pytest.mark.parametrize(
    "source",
    [
        "import os\nos.getcwd()\n",
        "from dataclasses import field\nfield()\n",
        "def f():\n    return g()\n\ndef g():\n    return len([])\n",
        "class A:\n    pass\n\nA()\n",
        "x = 1\n\ndef f():\n    return [x for _ in range(2)]\n",
        "def f():\n    global late\n    late = 1\n\ndef g():\n    return late\n",
        "def f(a):\n    def g():\n        return a\n    return g\n",
        "class A:\n    size = 1\n    double = size * 2\n",
        "print(__name__, __file__)\n",
        "try:\n    pass\nexcept ImportError as exc:\n    raise exc\n",
    ],
)
def test_what_a_module_binds_or_python_provides_is_not_reported(source):
    assert unbound(source) == set()


@pytest.mark.parametrize(
    ("source", "names"),
    [
        ("field()\n", {"field"}),
        ("def f():\n    return field(default=1)\n", {"field"}),
        ("class A:\n    x = field()\n", {"field"}),
        ("def f():\n    return [field(i) for i in range(2)]\n", {"field"}),
        ("def f():\n    global late\n    return late\n", {"late"}),
    ],
)
def test_a_global_read_and_bound_nowhere_is_reported(source, names):
    assert unbound(source) == names


@pytest.mark.parametrize(
    "source",
    [
        "from os import *\ngetcwd()\n",
        "try:\n    from os import *\nexcept ImportError:\n    pass\n",
    ],
)
def test_a_star_import_is_not_judged(source):
    with pytest.raises(Unjudged):
        unbound(source)


def test_only_the_names_the_series_adds_are_reported():
    original = b"def f():\n    return dynamic()\n"
    patched = b"def f():\n    return dynamic() + field()\n"
    assert "read `field`, which" in new_unbound_names(NAME, original, patched)
    assert new_unbound_names(NAME, original, original) is None


@pytest.mark.parametrize(
    ("name", "original", "patched", "expected"),
    [
        # A file the series creates is judged on its own.
        (NAME, None, b"field()\n", "read `field`, which"),
        # One it deletes, one not Python, one unpatched already unparseable:
        # nothing to judge.
        (NAME, b"x = 1\n", None, None),
        ("vllm/data.json", b"{}", b"field()\n", None),
        (NAME, b"line 1\nline 2\n", b"field()\n", None),
        (NAME, b"from os import *\n", b"from os import *\nfield()\n", None),
        # A series that breaks the syntax is said to.
        (NAME, b"x = 1\n", b"x = (1\n", "leaves vllm/demo.py unparseable: "),
    ],
)
def test_what_is_judged(name, original, patched, expected):
    found = new_unbound_names(name, original, patched)
    if expected is None:
        assert found is None
    else:
        assert expected in found
