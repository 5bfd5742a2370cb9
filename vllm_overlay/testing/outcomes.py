"""What a probe's failure on the unpatched sources proves, in one place for
the plugins that run probes there and for `vllm-overlay status --probe`,
which reads their JUnit report.

A probe proves its patch only by failing *because of the behaviour it
names*: its assertion (an `assert`, or `pytest.fail`, which `pytest.raises`
uses for "DID NOT RAISE"). Any other exception (an import, the platform
refusing the host, a missing dependency, a crash in the probe's own helper)
stopped it before it could tell, so its verdict is inconclusive.
"""

# The JUnit property a test gets when its call failed outside its assertion;
# its value names the exception's type.
FAILED_OUTSIDE_ASSERTION = "vllm-overlay-failed-outside-assertion"


def outside_assertion(exception_type: str) -> str:
    """A probe's outcome when its call raised `exception_type` instead of
    failing its assertion."""
    return f"failed outside its assertion ({exception_type})"
