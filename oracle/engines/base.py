"""The engine contract under its older import path, for engines written against it (`oracle.contract`)."""

from oracle.contract import *  # noqa: F403
from oracle.contract import __all__ as __all__  # noqa: F401
