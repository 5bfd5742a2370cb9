"""The second stage: from pinned upstream files to a patched wheel.

The pinned artifacts are downloaded and verified (`fetch`), the series is
applied with zero fuzz (`applier`), and the patched wheel is written with
every other file byte-identical (`wheel`).
"""
