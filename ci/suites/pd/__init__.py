"""Prefill/decode over NIXL end to end (`ci/suites/pd_e2e.py` drives it): the cases
and their verdicts (`cases`), one P/D pair behind upstream's proxy (`pair`),
what a decode server's `/metrics` counted (`metrics`), greedy completions and
their comparison (`completions`), and the fault cases (`faults`)."""
