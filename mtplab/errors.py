"""The exception types users catch (a leaf: imports nothing, never torch).

    ConfigError      an invalid setting (RunConfig, grid files, CLI flags)
    ModelLoadError   a model folder that cannot be loaded (a ConfigError: model= points at it)

Every message is one sentence naming the problem and the fix.
"""


class ConfigError(ValueError):
    """An invalid setting; the message is one sentence with the fix."""


class ModelLoadError(ConfigError):
    """A corrupt or mismatched model folder: "<path>: <problem>; <fix>"."""
