"""The fleet's two-revision row (issue 57): a rolling upgrade of the series
itself. A prefill and a decode server of the previous revision of the
release's series (`+hybridkv.N-1`, built from this clone's history by
`ci/envs/previous.py`) join the fleet (`ci/suites/pd/fleet.py`), and each
revision's decode server reads from the other's prefill server, as a fleet
half upgraded does. Between revisions the read confirmation's protocol may
move (`remote_reads_question` 2 then 3 on 0.32.0's `hybridkv.26` and `.27`):
each side must still read the KV and use it for the clean answer (a decode
server that computed the prompt instead answers it too), and the aftermath
checks hold for the previous revision's servers too (they serve on, their KV
caches empty, the prefill server reads no released blocks).
"""

from ci.suites.pd.cases import Check
from ci.suites.pd.completions import make_prompts
from ci.suites.pd.fleet import (
    COMPUTED_HERE,
    DECLINED,
    DECODE,
    PREFILL,
    PREFILL_CAP,
    PROMPTS,
    RETRY,
    A,
    Attack,
    Member,
)

# The build key of the previous revision's environment in the layout.
PREVIOUS = "previous"
PREVIOUS_PREFILL, PREVIOUS_DECODE = "prefill-previous", "decode-previous"
MEMBERS = (
    Member(PREVIOUS_PREFILL, PREVIOUS, PREFILL, PREFILL_CAP),
    Member(PREVIOUS_DECODE, PREVIOUS, DECODE),
)
HANDSHAKES = ((PREVIOUS_DECODE, A), (RETRY, PREVIOUS_PREFILL))
# After the fleet's own prompts, whose indices its rows use.
ROW_PROMPTS = make_prompts(count=2, prefix=0, seed=58)
FIRST = len(PROMPTS)


def two_revisions(attack: Attack, label: str) -> None:
    """The row: each revision's decode server reads a reference of the
    other's prefill server, and uses what it read (neither asks in vain nor
    declines the read, which would compute the prompt: a clean answer
    either way); `label` names the previous revision."""
    fleet = attack.fleet
    readers = (PREVIOUS_DECODE, RETRY)
    before = {name: fleet.lines(name, COMPUTED_HERE) for name in readers}
    before_declined = {name: fleet.lines(name, DECLINED) for name in readers}
    attack.add(
        f"a decode server of {label} reads from this revision's prefill server",
        fleet.decode(PREVIOUS_DECODE, FIRST, fleet.prefill(A, FIRST)),
    )
    attack.add(
        f"this revision's decode server reads from a prefill server of {label}",
        fleet.decode(RETRY, FIRST + 1, fleet.prefill(PREVIOUS_PREFILL, FIRST + 1)),
    )
    for name in readers:
        computed = fleet.lines(name, COMPUTED_HERE) - before[name]
        declined = fleet.lines(name, DECLINED) - before_declined[name]
        attack.checks.append(
            Check(
                f"fleet: {name} used the KV it read from the other revision",
                (computed, declined) == (0, 0),
                f"computed {computed} prompt(s) without reading, declined "
                f"{declined} read(s) after reading",
            )
        )
