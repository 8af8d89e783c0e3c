"""The one exception type for bad user input: the CLI prints its message alone, no traceback."""


class UsageError(ValueError):
    """Bad input. The message names the key or file, the bad value and the fix."""
