"""Errors that reach the user as one line and exit code 2 (bad input, bad flags, bad config)."""


class InputError(Exception):
    """Input the advisor cannot use: a log missing a line, a malformed file, a config typo."""
