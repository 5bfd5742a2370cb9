"""`python -m ci.fixtures.hf_standin` takes one HF_HOME; an option is not a
folder to write into (`--help` once wrote a hub cache into `./--help`)."""

import pytest

from ci.fixtures import hf_standin


def test_help_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        hf_standin.main(["--help"])
    assert exit_.value.code == 0
    assert "HF_HOME" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [[], ["a", "b"], ["--hf-home", "x"]])
def test_anything_but_one_folder_is_refused(tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        hf_standin.main(argv)
    assert exit_.value.code == 2
    assert list(tmp_path.iterdir()) == []
