"""The last stage: keeping the series alive as upstream moves, in rooms named
after the maintainer's steps (docs/maintainer/releases.md):

- `records`: what the project records about releases, and its tables;
- `workspace`: the scratch repositories and vLLM git sources commands work in;
- `status`: where each patch stands, and the release watch;
- `pinning`: pinning a release, and the release facts its sources decide;
- `rebasing`: moving a series to another release, and editing one by hand;
- `checks`: `lint`;
- `upstreaming`: turning a patch into an upstream pull request.

`arguments` holds the maintainer commands' arguments.
"""
