"""One NIXL READ from an agent whose process never calls into NIXL while
the read is in flight: what a decode server's read meets at a CPU prefill
server whose engine has stopped stepping. Two processes on this machine,
the real NIXL and UCX of the release environment, 1 MiB of host memory.

    python benchmarks/investigations/nixl_idle_read.py target DIR PAUSE_US
    python benchmarks/investigations/nixl_idle_read.py reader DIR

The target builds its agent without a progress thread (PAUSE_US 0, as
`nixl-cpu-no-busy-progress-thread` builds a CPU server's) or with one that
pauses PAUSE_US between polls (`nixl_progress_pause.py`), then idles for
`IDLE_S` and prints the CPU time its process used meanwhile. The reader
loads the target's metadata, as a decode worker loads a prefill worker's
after their handshake (the target never loads the reader's), and reads the
target's buffer twice while it idles (the first read opens the connection)
and prints how long each took, or that it had not completed within
`READ_LIMIT_S`. Both print one JSON object; DIR is where they swap
their metadata. `benchmarks/investigations/pd_progress_pause.py` runs them.
"""

import json
import pickle
import sys
import time
from pathlib import Path

IDLE_S = 5.0
READ_LIMIT_S = 2.0
BUFFER_BYTES = 1 << 20
POLL_S = 0.0005


def wait_for(path: Path, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {limit_s} s")
        time.sleep(0.01)


def build_agent(name: str, pause_us: int):
    from nixl._api import nixl_agent, nixl_agent_config

    if pause_us:
        from nixl_progress_pause import install

        install(pause_us)
    return nixl_agent(name, nixl_agent_config(enable_prog_thread=bool(pause_us)))


def target(folder: Path, pause_us: int) -> dict:
    import numpy as np

    buffer = np.full(BUFFER_BYTES, 7, dtype=np.uint8)
    region = (buffer.ctypes.data, buffer.nbytes, 0)
    agent = build_agent("target", pause_us)
    agent.register_memory([(*region, "")], "DRAM")
    descs = agent.get_serialized_descs(agent.get_xfer_descs([region], "DRAM"))
    (folder / "target.meta").write_bytes(
        pickle.dumps((agent.get_agent_metadata(), descs))
    )
    wait_for(folder / "idle")
    cpu, wall = time.process_time(), time.monotonic()
    time.sleep(IDLE_S)
    result = {
        "idle_cpu_s": time.process_time() - cpu,
        "idle_s": time.monotonic() - wall,
    }
    wait_for(folder / "read")
    return result


def timed_read(agent, handle) -> float | None:
    """Seconds until the read completed, or None past `READ_LIMIT_S`."""
    start = time.monotonic()
    state = agent.transfer(handle)
    while state == "PROC" and time.monotonic() - start < READ_LIMIT_S:
        time.sleep(POLL_S)
        state = agent.check_xfer_state(handle)
    if state == "ERR":
        raise RuntimeError("the READ failed")
    return time.monotonic() - start if state == "DONE" else None


def reader(folder: Path) -> dict:
    import numpy as np

    buffer = np.zeros(BUFFER_BYTES, dtype=np.uint8)
    region = (buffer.ctypes.data, buffer.nbytes, 0)
    agent = build_agent("reader", 0)
    agent.register_memory([(*region, "")], "DRAM")
    wait_for(folder / "target.meta")
    metadata, descs = pickle.loads((folder / "target.meta").read_bytes())
    name = agent.add_remote_agent(metadata)
    handle = agent.initialize_xfer(
        "READ",
        agent.get_xfer_descs([region], "DRAM"),
        agent.deserialize_descs(descs),
        name,
    )
    (folder / "idle").touch()
    time.sleep(0.5)
    first = timed_read(agent, handle)
    second = timed_read(agent, handle) if first is not None else None
    (folder / "read").touch()
    return {
        "first_read_s": first,
        "second_read_s": second,
        "data_arrived": bool((buffer == 7).all()),
    }


def main(argv: list[str]) -> int:
    role, folder = argv[0], Path(argv[1])
    result = target(folder, int(argv[2])) if role == "target" else reader(folder)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
