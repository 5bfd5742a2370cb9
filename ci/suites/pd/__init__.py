"""Prefill/decode over NIXL, the project's P/D library (`ci/suites/pd_e2e.py`
drives it on a CPU, `ci/suites/gpu_e2e.py` on a GPU, and the benchmarks use
it): the cases and their verdicts (`cases`), one P/D pair behind upstream's
proxy (`pair`), what a decode server's `/metrics` counted (`metrics`), greedy
completions and their comparison (`completions`), the load runs (`load`,
`bench`), the fault cases (`faults`, `receive`, `fleet`) and the verdicts on the GPU
driver's single-server runs (`gpu_verdicts`)."""
