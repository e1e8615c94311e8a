"""The exception types users catch (a leaf: imports nothing, never torch).

    ConfigError      an invalid setting (RunConfig, grid files, CLI flags)
    ModelLoadError   a model folder that cannot be loaded (a ConfigError: model= points at it)
    NonFiniteLogitsError  the target's forward was not finite (names the layer)
    AcceptanceAlarm  (a warning) acceptance collapsed over a stretch of the run

Every message is one sentence naming the problem and the fix.
"""


class ConfigError(ValueError):
    """An invalid setting; the message is one sentence with the fix."""


class ModelLoadError(ConfigError):
    """A corrupt or mismatched model folder: "<path>: <problem>; <fix>"."""


class AcceptanceAlarm(UserWarning):
    """A stretch of verify steps accepted far below the run's own mean, or nothing at all
    (mtplab/health.py `accept_alarm`): a drafting or verify fault that fails silently."""


class NonFiniteLogitsError(RuntimeError):
    """The target's forward for a request was not finite (a NaN or an inf in its logits, or
    a hidden state whose mean square overflows). The scheduler raises it with `rid` and
    `tokens` (the request's tokens so far); the engine re-raises it naming the layer where the
    values first stop being finite."""

    def __init__(self, message: str, rid: int = -1, tokens: tuple = ()):
        super().__init__(message)
        self.rid, self.tokens = rid, tokens
