"""The ground floor: the small pieces every stage shares (the one error type
and printer, paths and the cache's layout, locks, atomic writes, git, a tree
written out, METADATA renamed), importing nothing of the stages."""
