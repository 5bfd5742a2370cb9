"""Moving a series to another release: the replay (`rebase`), the references
it moves, its conflicts, and `edit` / `refresh` to change a series by hand."""
