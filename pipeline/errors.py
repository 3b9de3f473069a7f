"""The error every command turns into one line on stderr and exit code 2."""


class SettingsError(Exception):
    """A setting is missing or invalid; the message says which and how to fix it."""
