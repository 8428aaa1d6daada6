"""Policy backends: one `PolicyBackend` protocol, several engines behind it.

`TransformersBackend` imports torch and transformers (the harness's own dependencies);
`VLLMBackend` imports vLLM only when it is constructed; `OpenAICompatBackend` talks to a vLLM
server over HTTP (httpx only), built on an `OpenAICompatClient` and its `EndpointConfig`.
"""

from typing import TYPE_CHECKING, Any

from harness.policies.base import BackendUnavailable, Completion, PolicyBackend, SamplingParams
from harness.policies.openai_compat import EndpointConfig, OpenAICompatBackend, OpenAICompatClient

if TYPE_CHECKING:
    from harness.policies.transformers_backend import TransformersBackend
    from harness.policies.vllm_backend import VLLMBackend

__all__ = [
    "BackendUnavailable",
    "Completion",
    "EndpointConfig",
    "OpenAICompatBackend",
    "OpenAICompatClient",
    "PolicyBackend",
    "SamplingParams",
    "TransformersBackend",
    "VLLMBackend",
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
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
