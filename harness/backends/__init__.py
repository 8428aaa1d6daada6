"""Policy backends: one `PolicyBackend` protocol, several engines behind it.

`TransformersBackend` imports torch and transformers (the harness's own dependencies);
`VLLMBackend` imports vLLM only when it is constructed; `OpenAICompatBackend` talks to a vLLM
server over HTTP (httpx only), built on an `OpenAICompatClient` and its `EndpointConfig`.
"""

from harness.backends.base import BackendUnavailable, Completion, PolicyBackend, SamplingParams
from harness.backends.openai_compat import EndpointConfig, OpenAICompatBackend, OpenAICompatClient
from harness.backends.transformers_backend import TransformersBackend
from harness.backends.vllm_backend import VLLMBackend

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
