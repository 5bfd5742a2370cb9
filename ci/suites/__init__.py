"""The suites the harness runs on a release's environment: upstream vLLM's own
tests (`upstream_tests`), `vllm-overlay serve` end to end (`serve_e2e`), the
install from the index (`index_install`, then what a user runs in that
virtualenv: `user_install`, with `user_venv`), prefill/decode over NIXL
(`pd_e2e`, built on the P/D library `pd/`) and its GPU run (`gpu_e2e`)."""
