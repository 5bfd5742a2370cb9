"""What the project records about each release and the tables made from it:
the history of pins and drops, the verdicts, PATCHES.md and README's table."""
