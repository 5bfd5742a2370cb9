"""The first stage: what the project maintains and pins.

The pins of each supported release (`pins`), its series of patches
(`model`), and the manifest a patched build carries to say which series it
holds (`manifest`). Everything downstream (build, runtime, track, doctor)
reads these; nothing here imports from them.

Kept free of imports: `serve` reads the manifest on its light start path.
"""
