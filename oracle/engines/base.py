"""The engine contract under its older import path, for engines written against it (`oracle.engines.contract`)."""

from oracle.engines.contract import *  # noqa: F403
from oracle.engines.contract import __all__ as __all__  # noqa: F401
