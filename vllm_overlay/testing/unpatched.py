"""pytest plugin: run probes against the *unpatched* sources of the installed
patched vLLM, and expect them to fail.

A probe proves its patch only if it fails without it. The pristine sources are
served by `vllm_overlay.testing.pristine`, which this plugin loads; on top of
it each probe's verdict is inverted: a failed assertion passes ("still
needed"), a pass fails ("passes without the patch: upstream absorbed it, or
the probe is weak"). A call that fails outside its assertion fails too
("inconclusive": its import, the platform, a dependency or its own helper
failed before the behaviour it names could show), and setup and collection
errors stay errors: they prove nothing.

Use: `pytest -p vllm_overlay.testing.unpatched PROBE_IDS...`.
"""

import pytest

from vllm_overlay.testing.outcomes import outside_assertion
from vllm_overlay.testing.pristine import RELEASE, failed_outside_assertion

pytest_plugins = ["vllm_overlay.testing.pristine"]


def pytest_report_header(config: pytest.Config) -> str:
    return "vllm-overlay: verdicts inverted: each probe must fail"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.when != "call" or hasattr(report, "wasxfail"):
        return
    release = item.config.stash[RELEASE]
    kind = failed_outside_assertion(call) if report.failed else None
    if kind is not None:
        report.longrepr = (
            f"{item.nodeid} {outside_assertion(kind)} on unpatched vLLM "
            f"{release}: inconclusive, it proves nothing about its patch "
            "(an import, the platform, a dependency or the probe's own helper "
            f"failed first)\n\n{report.longrepr}"
        )
    elif report.failed:
        report.outcome = "passed"
        report.sections.append(
            ("vllm-overlay", f"fails on unpatched vLLM {release}: still needed")
        )
    elif report.passed:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} passes on unpatched vLLM {release}: the probe does "
            "not prove its patch (upstream absorbed it, or the probe is weak)"
        )
