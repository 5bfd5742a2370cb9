"""The third stage: the patched wheel.

`builder` writes a pinned upstream wheel again with the series applied and
every other member byte-identical; `raw_zip` copies a zip member as its
compressed bytes, so compiled extensions are never inflated and deflated.
"""
