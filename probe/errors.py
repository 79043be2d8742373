# old home of these names, while engine/ imports them here
from kog.errors import KogError, UsageError, cli_entry  # noqa: F401
