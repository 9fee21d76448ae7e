"""The one exception type users see: the CLI turns it into a one-line message and exit code 2."""


class OarError(Exception):
    """A user-facing error: bad input file, bad option, bad config. Message names the culprit."""


class InputError(OarError):
    """A bad row of a stage's input table, found by the stage itself; the runner adds the file name."""
