# Sourced by the tools: make sure the project's tooling virtualenv (.venv) exists
# and holds vllm-overlay (editable) with its dev dependencies, then put it first
# on PATH. Reinstalls only when pyproject.toml changed.
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$repo_root/.venv"
stamp="$venv/.vllm-overlay-pyproject.sha256"
want=$(sha256sum "$repo_root/pyproject.toml" | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "vllm-overlay: preparing the tooling environment in $venv" >&2
  python3 -m venv "$venv" &&
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      -e "$repo_root[dev]" &&
    echo "$want" >"$stamp" || {
      echo "vllm-overlay: could not prepare $venv" >&2
      exit 1
    }
fi
export PATH="$venv/bin:$PATH"
