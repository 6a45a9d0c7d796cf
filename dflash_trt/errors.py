"""Exceptions that reach users. The CLI prints them as one line, without a traceback."""


class DFlashError(Exception):
    """Base of every error caused by user input (files, configs, arguments)."""


class ConfigError(DFlashError):
    """A config file or field is missing, malformed or unsupported."""


class CheckpointError(DFlashError):
    """A checkpoint's tensors are missing, unknown or mis-shaped."""


class CompatibilityError(DFlashError):
    """A drafter does not fit the target it is paired with."""
