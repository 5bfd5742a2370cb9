"""`vllm-overlay serve`: run an unpatched vLLM with the series active.

The patched wheel is the way to ship the series; this package is the way to
try it on an installed vLLM without touching site-packages. The series is
applied to the installed files once into a cache (`sources`), served in the
serving process by a meta-path finder before vLLM is imported (`serve`), and
carried into every process vLLM starts (`propagate`): forked children inherit
the finder, spawned ones install it again from `boot/sitecustomize.py`.

Kept free of imports: spawned processes import this package at start-up.
"""
