"""Whether the hybrid KV cache manager (HMA) will be on, as vLLM decides it.

Most of the doctor's rules turn on this one question (a hybrid model does
not start without HMA, a connector without it turns it off, LMCache's
connectors behave differently with it), so it is answered once, here, for
`rules.py` and `rules_lmcache.py` alike.
"""

from vllm_overlay.doctor.facts import MULTI, ConnectorFacts, Facts


def hma_enabled(facts: Facts) -> bool | None:
    """Whether the hybrid KV cache manager (HMA) will be on.

    vLLM's own decision when it built the config; otherwise its rule, from
    `VllmConfig.__post_init__` (config/vllm.py): an explicit flag wins; else
    HMA is off when the platform lacks it or
    `KVConnectorFactory.supports_hma_config` is False.
    """
    launch = facts.launch
    if launch is None:
        return None
    if launch.hma_enabled is not None:
        return launch.hma_enabled
    if launch.hma_flag is not None:
        return not launch.hma_flag
    top = facts.connectors[0].supports_hma if facts.connectors else True
    votes = (launch.platform_supports_hma, top)
    if False in votes:
        return False
    return None if None in votes else True


def without_hma(facts: Facts) -> list[ConnectorFacts]:
    """The selected connectors that make HMA impossible: the connector, or a
    MultiConnector's children without it (the MultiConnector itself when it
    has none; `MultiConnector.all_children_support_hma`)."""
    if not facts.connectors:
        return []
    top, children = facts.connectors[0], facts.connectors[1:]
    if top.name == MULTI and children:
        return [c for c in children if c.supports_hma is False]
    return [top] if top.supports_hma is False else []
