#!/usr/bin/env bash
# The whole test suite: style and series checks, the tooling tests, then for
# every pinned release (or those named: tools/test.sh 0.32.0) the patched wheel,
# its test environment, upstream vLLM's own tests and our probes, patched and
# unpatched. Heavy parts are cached under ~/.cache/vllm-overlay.
set -euo pipefail
source "$(dirname "$0")/venv.sh"
cd "$repo_root"
exec python -m ci.harness "$@"
