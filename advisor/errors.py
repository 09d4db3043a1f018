"""Errors that reach the user as one line and exit code 2 (bad input, bad flags, bad config)."""


class InputError(Exception):
    """Input the advisor cannot use: a log missing a line, a malformed file, a config typo."""


class LimitExceeded(InputError):
    """Input larger than a configured cap (a body, a line, labels on a series, series in a scrape): the
    advisor counts it as an error for that source and holds none of it."""
