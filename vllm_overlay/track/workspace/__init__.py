"""Where a maintainer command works: a scratch git repository of a
release's sources, and a vLLM git commit read as a release."""
