"""The test environments: one per pinned release with its patched build
(`release`, from the requirements `requirements` computes), a cheap one
with the release's unpatched wheel (`unpatched`), and environments layered
over a release's (`layered`), among them the release's previous revision
built from the clone's history (`previous`). The `*-requirements.txt`
files here are the pinned extras they install."""
