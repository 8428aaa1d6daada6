"""Policy backends: one `PolicyBackend` protocol, several engines behind it.

`TransformersBackend` imports torch and transformers (the harness's own dependencies);
`VLLMBackend` imports vLLM only when it is constructed.
"""

from harness.backends.base import BackendUnavailable, Completion, PolicyBackend, SamplingParams
from harness.backends.transformers_backend import TransformersBackend
from harness.backends.vllm_backend import VLLMBackend

__all__ = [
    "BackendUnavailable",
    "Completion",
    "PolicyBackend",
    "SamplingParams",
    "TransformersBackend",
    "VLLMBackend",
]
