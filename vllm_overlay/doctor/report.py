"""The report `vllm-overlay doctor` prints, and its exit status.

The header states the facts the findings rest on (which build, whether the
model is hybrid and who said so, each connector's HMA support), so that a
wrong conclusion can be traced to a wrong fact.
"""

import textwrap
from dataclasses import dataclass

from vllm_overlay.doctor.facts import ConnectorFacts, Facts
from vllm_overlay.doctor.findings import Finding, Severity
from vllm_overlay.doctor.hma import hma_enabled

WIDTH = 88


@dataclass(frozen=True)
class Report:
    facts: Facts
    findings: tuple[Finding, ...]

    @property
    def exit_code(self) -> int:
        """0 when there is nothing to act on, 1 otherwise (as `brew doctor`):
        a launch that silently degrades is not a fine one."""
        return int(any(f.severity > Severity.INFO for f in self.findings))

    def render(self) -> str:
        lines = [*_header(self.facts), ""]
        for finding in sorted(self.findings, key=lambda f: -f.severity):
            label = finding.severity.name.lower() + ":"
            lines.append(_wrap(f"{label:8} {finding.what}"))
            if finding.fix:
                lines.append(_wrap(f"{'':8} what to do: {finding.fix}"))
        errors = sum(f.severity == Severity.ERROR for f in self.findings)
        warnings = sum(f.severity == Severity.WARNING for f in self.findings)
        if errors:
            verdict = "vLLM would not start or serve as asked"
        elif warnings:
            verdict = "vLLM would start, but not work as the flags suggest"
        else:
            verdict = "nothing to act on"
        lines += ["", f"{errors} error(s), {warnings} warning(s): {verdict}"]
        return "\n".join(lines) + "\n"


def _wrap(text: str) -> str:
    """One finding part, wrapped under its text column."""
    return textwrap.fill(text, WIDTH, subsequent_indent=" " * 9, break_on_hyphens=False)


def _header(facts: Facts) -> list[str]:
    build = facts.build
    if build.version is None:
        return ["vLLM:        not installed"]
    series = build.active_series or "no series (unpatched)"
    lines = [f"vLLM:        {build.version} ({build.distribution}), {series}"]
    if facts.model is not None:
        hybrid = {True: "hybrid", False: "not hybrid", None: "hybrid: unknown"}
        model = facts.model
        lines.append(
            f"model:       {model.name}: {hybrid[model.hybrid]} "
            f"({model.detail}; from {model.source})"
        )
    if facts.connectors:
        lines.append(f"connectors:  {', '.join(map(_connector, facts.connectors))}")
    state = {True: "on", False: "off", None: "unknown"}[hma_enabled(facts)]
    lines.append(f"hybrid KV cache manager: {state}")
    if facts.launch is not None and facts.launch.speculative is not None:
        lines.append(f"speculative: {facts.launch.speculative.describe()}")
    peer = facts.peer
    if peer is not None:
        connectors = ", ".join(map(_connector, peer.connectors)) or "no connector"
        speculative = peer.launch.speculative
        described = speculative.describe() if speculative else "unknown"
        lines.append(
            f"peer:        {peer.model}: {connectors}; speculative: {described}"
        )
    return lines


def _connector(connector: ConnectorFacts) -> str:
    hma = {True: "HMA", False: "no HMA", None: "unresolved"}[connector.supports_hma]
    child = f"{connector.parent} child " if connector.parent else ""
    return f"{child}{connector.name} ({hma})"
