"""Keeping the series consistent without building anything (`lint`): the
patches, the names and attributes they read, the records."""
