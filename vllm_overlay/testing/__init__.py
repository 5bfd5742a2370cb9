"""pytest support for proving patches against the installed vLLM."""
