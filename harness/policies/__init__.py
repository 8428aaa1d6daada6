"""harness's policies room: one `PolicyBackend` protocol, several engines behind it.

`TransformersBackend` imports torch and transformers (the harness's own dependencies);
`VLLMBackend` imports vLLM only when it is constructed; `OpenAICompatBackend` talks to a vLLM
server over HTTP (httpx only), built on an `OpenAICompatClient` and its `EndpointConfig`;
`RayEnginesBackend` drives OpenRLHF's Ray vLLM engines. A policy directory's prompt protocol
(`PolicyProtocol`, `read_policy_protocol`) says how that policy must be prompted.
"""

from typing import TYPE_CHECKING

from harness.lazy import lazy_names
from harness.policies.base import (
    STOP_STRINGS,
    BackendUnavailable,
    Completion,
    ConcurrentPolicyBackend,
    PolicyBackend,
    SamplingParams,
)

if TYPE_CHECKING:
    from harness.policies.openai_compat import (
        EndpointConfig,
        OpenAICompatBackend,
        OpenAICompatClient,
        TextCompletion,
    )
    from harness.policies.openrlhf_ray import RayEnginesBackend
    from harness.policies.policy_protocol import (
        ENV_FIELDS,
        PolicyProtocol,
        PolicyProtocolError,
        read_policy_protocol,
    )
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


# Imported on first use: the torch-based backends (`import torch` takes seconds; a command's
# `--help` or an HTTP-only run must not pay it), and the prompt protocol, which reads the env's
# settings and so imports envs and retrieval (bm25s, faiss, numba): a vLLM worker process that
# re-imports its parent's main module must not load them (vLLM-CPU's kernel scan of every loaded
# module fails on numba's llvmlite wrappers). The endpoint client too: its wall-clock bounds come
# from retrieval, whose face loads bm25s.
__getattr__ = lazy_names(
    __name__,
    {
        **{
            name: "harness.policies.openai_compat"
            for name in (
                "EndpointConfig",
                "OpenAICompatBackend",
                "OpenAICompatClient",
                "TextCompletion",
            )
        },
        "TransformersBackend": "harness.policies.transformers_backend",
        "VLLMBackend": "harness.policies.vllm_backend",
        "RayEnginesBackend": "harness.policies.openrlhf_ray",
        **{
            name: "harness.policies.policy_protocol"
            for name in (
                "ENV_FIELDS",
                "PolicyProtocol",
                "PolicyProtocolError",
                "read_policy_protocol",
            )
        },
    },
)
