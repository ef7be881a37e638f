"""The error `querygate eval` shows the operator instead of a traceback."""


class EvalError(ValueError):
    """Why an evaluation cannot run (a bad file, a tenant without documents); safe to show."""
