"""Pinning a release: its artifacts by sha256 (`pin`, `pin --bump`) and the
release facts its sources decide."""
