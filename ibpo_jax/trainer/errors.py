"""`RunError`, the base of every error that stops a run with one line naming its culprit
(workdir, config key, checkpoint, metrics file); the entry points print it without a
traceback. A leaf module, so the modules that raise run errors import it one way."""


class RunError(RuntimeError):
    """A run cannot start or go on; the message is one line naming the culprit."""
