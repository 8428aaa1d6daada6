"""The env's text space, and the guard that keeps it out of `AsyncVectorEnv`'s shared memory.

Gymnasium (1.x) reads an `AsyncVectorEnv`'s shared-memory observations once, when the vector
env is built. For array spaces that read is a live numpy view; for `Text` it is a tuple of
strings decoded from the still-empty buffer, so every later reset and step silently returns
the same 65,536 tab characters. `EnvText` is `Text` with one difference: Gymnasium's
shared-memory factory refuses it with a message that names the fix (`shared_memory=False`,
under which these envs work). Registering that refusal with Gymnasium's `singledispatch` is
this package's second import-time side effect, and it only touches this class.
"""

from __future__ import annotations

import multiprocessing
from types import ModuleType
from typing import NoReturn

from gymnasium.spaces import Text
from gymnasium.vector.utils import create_shared_memory

from envs.errors import EnvConfigError

__all__ = ["EnvText"]


class EnvText(Text):
    """`gymnasium.spaces.Text` for prompts, actions and observations (see the module doc)."""


@create_shared_memory.register(EnvText)
def _refuse_shared_memory(
    space: EnvText, n: int = 1, ctx: ModuleType = multiprocessing
) -> NoReturn:
    raise EnvConfigError(
        "trace-rl envs cannot pass text through AsyncVectorEnv's shared memory: Gymnasium "
        "decodes a Text buffer once, when the vector env is built, so every step would return "
        "the same stale strings. Build it with AsyncVectorEnv(env_fns, shared_memory=False)."
    )
