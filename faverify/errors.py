"""Errors the command line turns into exit codes (docs/design.md): usage/environment errors exit 2."""


class UsageError(ValueError):
    """Bad input from the user: names the argument, its value and the rule. Exit code 2."""

    def __init__(self, argument: str, value: object, rule: str):
        self.argument, self.value, self.rule = argument, value, rule
        super().__init__(f"{argument}={value!r}: {rule}")


class EnvironmentProblem(RuntimeError):
    """The machine cannot do what was asked (no GPU, no nvcc, nothing ran). Exit code 2."""


class Unsupported(NotImplementedError):
    """A subject cannot run this case: counted as skipped with the reason, never as a pass."""


class OwnError(RuntimeError):
    """faverify's own code failed (a bug in faverify, never the subject's): exit code 2, in one line."""
