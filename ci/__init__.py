"""The test harness and the CI drivers: per-release test environments
(`release_env`, `unpatched_env`), the offline Hugging Face hub stand-in and
tiny models (`hf_standin`, `tiny_model`), upstream vLLM's own tests
(`upstream_tests`), the end-to-end serve and P/D suites (`serve_e2e`,
`pd_e2e` with `pd/`), the GPU driver (`gpu_e2e`), the nightly check against
vLLM main (`track_main`), and the whole suite (`harness`, which
`tools/test.sh` runs).

Every module runs as `python -m ci.X` from the repository root, where `ci`
and `vllm_overlay` import from this checkout; none touches `sys.path`. The two
that write files under a release environment's Python (`hf_standin`,
`tiny_model`) are started there the same way.
"""
