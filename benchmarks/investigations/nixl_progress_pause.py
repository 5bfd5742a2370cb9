"""Builds every NIXL agent of a process with NIXL's progress thread on,
pausing between its polls: what a `nixl_agent_config` field for the agent's
`pthrDelay` would do, had NIXL's Python API one. NIXL 1.4.1's `nixl_agent`
sets `pthrDelay = 0` whatever its config says (`nixl_cu12/_api.py:230`),
and with 0 its UCX progress thread polls without pause, a core's worth of
CPU (`nixl-cpu-no-busy-progress-thread`). With a pause the thread sleeps in
`poll()` on the UCX workers' event descriptors, for at most the pause
rounded up to a millisecond (NIXL's `nixlUcxSharedThread`), so it still
wakes at once when a peer's request arrives.

Not part of the product: `benchmarks/investigations/pd_progress_pause.py` puts this file
into an environment of its own, with a `.pth` line that calls `install`,
and `benchmarks/investigations/nixl_idle_read.py` calls it directly. It touches NIXL's
module only while an agent is built, which every NIXL release need not
allow: `install` fails loudly where the module differs.
"""

import sys


class _PausedBindings:
    """NIXL's bindings module, except that each agent they build gets the
    pause in its config."""

    def __init__(self, bindings: object, pause_us: int) -> None:
        self._bindings = bindings
        self._pause_us = pause_us

    def __getattr__(self, name: str) -> object:
        return getattr(self._bindings, name)

    def nixlAgent(self, name: str, config: object) -> object:
        config.pthrDelay = self._pause_us  # type: ignore[attr-defined]
        return self._bindings.nixlAgent(name, config)  # type: ignore[attr-defined]


def install(pause_us: int) -> None:
    """Every `nixl_agent` built after this runs NIXL's progress thread,
    pausing `pause_us` microseconds (at least 1 ms) between polls."""
    if pause_us < 1:
        raise ValueError(f"a pause of {pause_us} us is NIXL's busy thread")
    from nixl import _api

    if not hasattr(_api, "nixlBind"):
        raise RuntimeError(f"{_api.__file__} builds its agents some other way")
    # A virtualenv's site-packages may be read twice (`lib64` links to `lib`),
    # and with it the `.pth` line that calls this.
    installed = getattr(_api.nixl_agent, "_progress_pause_us", None)
    if installed == pause_us:
        return
    if installed is not None:
        raise RuntimeError(f"NIXL's agents already pause {installed} us")
    build = _api.nixl_agent.__init__

    def build_paused(self, agent_name, nixl_conf=None, instantiate_all=False):
        conf = nixl_conf or _api.nixl_agent_config()
        conf.enable_pthread = True
        bindings = _api.nixlBind
        _api.nixlBind = _PausedBindings(bindings, pause_us)
        try:
            build(self, agent_name, conf, instantiate_all)
        finally:
            _api.nixlBind = bindings
        print(
            f"nixl_progress_pause: agent {agent_name} runs NIXL's progress thread,"
            f" pausing {pause_us} us between polls",
            file=sys.stderr,
            flush=True,
        )

    _api.nixl_agent.__init__ = build_paused
    _api.nixl_agent._progress_pause_us = pause_us
