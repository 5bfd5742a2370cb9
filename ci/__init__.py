"""The test harness: per-release virtual environments, an offline stand-in for
the Hugging Face hub, and the runner for upstream vLLM's own unit tests.

It is a package so that CI scripts and the project's CLI can import it from the
repository root (`from ci.release_env import ensure_release_env`); every module
also runs as a script for use by hand.
"""
