import sys
from pathlib import Path

import pytest

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.runtime import source_overlay


@pytest.fixture
def package(tmp_path, monkeypatch):
    """An importable package `ovl_pkg` with a submodule and a subpackage."""
    root = tmp_path / "site" / "ovl_pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "mod.py").write_text("VALUE = 'installed'\n")
    (root / "sub" / "__init__.py").write_text("INIT = 'installed'\n")
    (root / "sub" / "leaf.py").write_text("LEAF = 'installed'\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    saved = list(sys.meta_path)
    yield tmp_path
    sys.meta_path[:] = saved
    for name in [n for n in sys.modules if n.startswith("ovl_pkg")]:
        del sys.modules[name]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_module_names():
    assert (
        source_overlay.module_name("vllm/v1/core/sched/scheduler.py")
        == "vllm.v1.core.sched.scheduler"
    )
    assert source_overlay.module_name("vllm/v1/__init__.py") == "vllm.v1"


def test_listed_modules_come_from_the_replacement(package):
    mod = write(package / "alt" / "mod.py", "VALUE = 'replaced'\n")
    init = write(package / "alt" / "sub_init.py", "INIT = 'replaced'\n")
    source_overlay.install({"ovl_pkg.mod": mod, "ovl_pkg.sub": init})
    import ovl_pkg.mod
    import ovl_pkg.sub
    import ovl_pkg.sub.leaf

    assert ovl_pkg.mod.VALUE == "replaced"
    assert ovl_pkg.mod.__file__ == str(mod)
    assert ovl_pkg.sub.INIT == "replaced"
    # The replaced package keeps its installed submodules.
    assert ovl_pkg.sub.leaf.LEAF == "installed"


def test_tracebacks_point_at_the_replacement_lines(package):
    mod = write(package / "alt" / "mod.py", "def boom():\n    raise ValueError\n")
    source_overlay.install({"ovl_pkg.mod": mod})
    import ovl_pkg.mod

    with pytest.raises(ValueError) as info:
        ovl_pkg.mod.boom()
    frame = info.traceback[-1]
    assert (Path(frame.path), frame.lineno + 1) == (mod, 2)


def test_refuses_modules_already_imported(package):
    import ovl_pkg.mod  # noqa: F401

    with pytest.raises(OverlayError, match=r"already imported: ovl_pkg\.mod"):
        source_overlay.install({"ovl_pkg.mod": package / "x.py"})
