"""Where each patch stands on a release (`status`, `--probe`, `--record`)
and which releases upstream published that are not pinned (`--releases`)."""
