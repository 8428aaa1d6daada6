"""`vllm.utils`."""

import uuid


def random_uuid() -> str:
    """A fresh request id."""
    return uuid.uuid4().hex
