"""Sending a patch upstream (`extract`): the pull request's text and its
probes turned into upstream tests."""
