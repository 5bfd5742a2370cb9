"""One-off investigations: each answered a question a dated page of
docs/benchmarks/ records (its command and commit there). Kept runnable, not
run again as a matter of course: the benchmarks one level up are."""
