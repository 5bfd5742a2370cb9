#!/usr/bin/env bash
# How each patch fares against vLLM releases: tools/status.sh [RELEASE...] [--json] [--probe]
# (default: every pinned release; an unpinned release is downloaded unverified).
set -euo pipefail
source "$(dirname "$0")/venv.sh"
cd "$repo_root"
exec python -m vllm_overlay status "$@"
