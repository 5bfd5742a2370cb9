"""The last stage: keeping the series alive as upstream moves.

The maintainer commands: how each patch fares on other releases (`status`,
`probing`, `verdicts`), replaying a series onto a new release (`rebase`,
`history`), re-exporting it from a git tree (`refresh`), turning a patch into
an upstream contribution (`extract`, `probe_conversion`), pinning a release
(`pin`), and checking and tabulating the series (`lint`, `table`).
"""
