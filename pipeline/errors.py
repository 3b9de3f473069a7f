"""The error every command turns into one line on stderr and exit code 2, and serve's other
exit code (its --on-offset-reset help names it)."""

# `ragpulse serve --on-offset-reset fail` stops with this code when a saved offset is gone.
EXIT_OFFSET_RESET = 3


class SettingsError(Exception):
    """A setting is missing or invalid; the message says which and how to fix it."""
