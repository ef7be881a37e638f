"""What the pydantic model of every configuration section shares."""

from pydantic import ConfigDict

# Unknown keys refused (a typo must not pass silently), frozen once loaded, and no inf or nan:
# an infinite timeout or deadline passes `gt=0` and turns its cut-off off for good.
SECTION = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
