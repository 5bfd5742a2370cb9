"""The `vllm-overlay` console script.

`vllm-overlay serve` runs a server whose start pays for every module this
process imports before vLLM (the activation budget is 50 ms), while the
maintainer commands load the downloader, the wheel builder and the git
plumbing. So `serve` is dispatched here, before any of those is imported,
with everything after it handed to vLLM verbatim; every other command goes to
`vllm_overlay.cli`.
"""

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        from vllm_overlay.runtime.serve import serve

        return serve(argv[1:])
    from vllm_overlay.cli import main as cli_main

    return cli_main(argv)
