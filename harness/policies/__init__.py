"""harness's policies room: one `PolicyBackend` protocol, several engines behind it.

`TransformersBackend` imports torch and transformers (the harness's own dependencies);
`VLLMBackend` imports vLLM only when it is constructed; `OpenAICompatBackend` talks to a vLLM
server over HTTP (httpx only), built on an `OpenAICompatClient` and its `EndpointConfig`;
`RayEnginesBackend` drives OpenRLHF's Ray vLLM engines. A policy directory's prompt protocol
(`PolicyProtocol`, `read_policy_protocol`) says how that policy must be prompted.
"""

from typing import TYPE_CHECKING, Any

from harness.policies.base import (
    STOP_STRINGS,
    BackendUnavailable,
    Completion,
    ConcurrentPolicyBackend,
    PolicyBackend,
    SamplingParams,
)
from harness.policies.openai_compat import (
    EndpointConfig,
    OpenAICompatBackend,
    OpenAICompatClient,
    TextCompletion,
)
from harness.policies.policy_protocol import (
    ENV_FIELDS,
    PolicyProtocol,
    PolicyProtocolError,
    read_policy_protocol,
)

if TYPE_CHECKING:
    from harness.policies.openrlhf_ray import RayEnginesBackend
    from harness.policies.transformers_backend import TransformersBackend
    from harness.policies.vllm_backend import VLLMBackend

__all__ = [
    "ENV_FIELDS",
    "STOP_STRINGS",
    "BackendUnavailable",
    "Completion",
    "ConcurrentPolicyBackend",
    "EndpointConfig",
    "OpenAICompatBackend",
    "OpenAICompatClient",
    "PolicyBackend",
    "PolicyProtocol",
    "PolicyProtocolError",
    "RayEnginesBackend",
    "SamplingParams",
    "TextCompletion",
    "TransformersBackend",
    "VLLMBackend",
    "read_policy_protocol",
]


def __getattr__(name: str) -> Any:
    """Import the torch-based backends on first use.

    `import torch` takes seconds; a command's `--help` (or an HTTP-only run) must not pay it.
    """
    if name == "TransformersBackend":
        from harness.policies.transformers_backend import TransformersBackend

        return TransformersBackend
    if name == "VLLMBackend":
        from harness.policies.vllm_backend import VLLMBackend

        return VLLMBackend
    if name == "RayEnginesBackend":
        from harness.policies.openrlhf_ray import RayEnginesBackend

        return RayEnginesBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
