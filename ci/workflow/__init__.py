"""What the GitHub workflows run besides the suite: the build and test
matrices read from the pins, and the release's draft check."""
