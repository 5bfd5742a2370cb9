"""The test harness and the suites it runs, in three rooms and two drivers:

- `envs/`: the per-release test environments (`release`, the requirements it
  is built from in `requirements`) and the cheap unpatched one (`unpatched`),
  with the requirements files they install.
- `fixtures/`: what the suites serve and read offline: the Hugging Face hub
  stand-in (`hf_standin`) and the tiny models (`tiny_model`, their configs in
  `tiny_configs`).
- `suites/`: upstream vLLM's own tests (`upstream_tests`, with
  `deselected.toml` and `pytest_plugins/`), the end-to-end runs (`serve_e2e`,
  `index_install`, `pd_e2e` with the P/D library `pd/`, `gpu_e2e`) and the
  servers they start (`servers`).
- `harness`: the whole suite, which `tools/test.sh` runs.
- `track_main`: the nightly check of the series against vLLM main.

Every module with a command runs as `python -m ci.ROOM.X` (or `ci.harness`,
`ci.track_main`) from the repository root, where `ci` and `vllm_overlay`
import from this checkout; none touches `sys.path`. The two that write files
under a release environment's Python (`fixtures.hf_standin`,
`fixtures.tiny_model`) are started there the same way.
"""
