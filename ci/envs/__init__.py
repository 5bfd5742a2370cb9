"""The test environments: one per pinned release with its patched build
(`release`, from the requirements `requirements` computes) and a cheap one
with the release's unpatched wheel (`unpatched`). The `*-requirements.txt`
files here are the pinned extras they install."""
