"""The base of every error SpecMemo reports as one line (the CLI prints it and exits 1)."""


class SpecMemoError(Exception):
    """An input or environment problem with a known fix; the message names the fix."""


class ConfigError(SpecMemoError, ValueError):
    """An option or configuration value is out of range."""


class ManifestError(SpecMemoError, ValueError):
    """The artifact folder or its manifest is missing, malformed or inconsistent."""
