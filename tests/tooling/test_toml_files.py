"""The one reader of the project's TOML files: each defect one line naming
the file."""

import pytest

from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.toml_files import read_toml


def test_a_table_is_read(tmp_path):
    (tmp_path / "x.toml").write_text('[releases."0.32.0"]\nrevision = 1\n')
    assert read_toml(tmp_path / "x.toml", "pins file") == {
        "releases": {"0.32.0": {"revision": 1}}
    }


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: None, "pins file {p} does not exist"),
        (lambda p: p.mkdir(), "cannot read {p}: [Errno 21] Is a directory"),
        (lambda p: p.write_bytes(b"\xff"), "cannot read {p}: 'utf-8' codec"),
        (lambda p: p.write_text("revision = "), "{p} is not valid TOML: "),
    ],
)
def test_each_defect_is_one_error_naming_the_file(tmp_path, make, says):
    path = tmp_path / "x.toml"
    make(path)
    with pytest.raises(OverlayError) as caught:
        read_toml(path, "pins file")
    assert str(caught.value).startswith(says.format(p=path))
