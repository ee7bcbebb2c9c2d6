"""clnet's one exception base: every error clnet raises on purpose is a `clnet.Error`, so a user can catch them all.

Each subclass also derives from the built-in exception it has always been (ValueError, MemoryError, ...), so code
that caught those keeps working. This module imports nothing of clnet's: every other module may use it.
"""


class Error(Exception):
    """Base of every clnet error (`except clnet.Error` catches them all)."""
