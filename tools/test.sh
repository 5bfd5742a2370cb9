#!/usr/bin/env bash
# The whole test suite: style and series checks, the tooling tests, then for
# every pinned release (or those named: tools/test.sh 0.32.0) the patched wheel,
# its test environment, upstream vLLM's own tests and our probes, patched and
# unpatched. Heavy parts are cached under ~/.cache/vllm-overlay.
#
# Usage: tools/test.sh [--release-only] [RELEASE...]
#   --release-only  only the releases' steps, without the static checks and the
#                   tooling tests (minutes) before them: for rerunning a release
#                   after they passed. CI (.ci/run) runs everything.
set -euo pipefail
source "$(dirname "$0")/venv.sh"
cd "$repo_root"
exec python -m ci.harness "$@"
