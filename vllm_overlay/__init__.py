"""vllm-overlay: a maintained patch series over pinned vLLM releases.

The series makes hybrid models (Mamba / GatedDeltaNet / linear attention plus
full attention) work with external KV caches. This package holds the tooling
that keeps the series honest: the series model and its linter, the zero-fuzz
applier and the patched-wheel builder.
"""
