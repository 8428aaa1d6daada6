"""`ray._private`: the node address OpenRLHF asks for."""

from . import services  # noqa: F401
