"""A stand-in `flash_attn` so that OpenRLHF's models import where flash-attn is not installed.

OpenRLHF 0.11.2's `openrlhf/models/ring_attn_utils.py` imports `flash_attn.bert_padding` and
`flash_attn.utils.distributed` at module level (lines 3-4), so `openrlhf.models` (`Actor`,
`PolicyLoss`) and everything above it fail to import on CPU, where flash-attn (a CUDA build)
cannot be installed. Upstream PR https://github.com/OpenRLHF/OpenRLHF/pull/1302 makes that import
optional; until a release carries it, `ensure_flash_attn` installs pure-torch stand-ins for the
four helpers OpenRLHF takes from there. It is the project's one documented monkeypatch
(docs/style.md §3).

What the stand-in is not: a flash-attention kernel. transformers decides whether flash-attn is
usable from the installed *distributions*, not from `sys.modules`, so
`attn_implementation="flash_attention_2"` still fails cleanly and a CPU run must pick `sdpa` or
`eager`. `flash_attn.ops` is deliberately absent, so `openrlhf.models.utils.log_probs_from_logits`
takes its pure-torch path.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import logging
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.policies.base import BackendUnavailable

if TYPE_CHECKING:
    import torch
    import torch.distributed

__all__ = [
    "SHIM_VERSION",
    "OpenRLHFLosses",
    "ensure_flash_attn",
    "flash_attn_installed",
    "is_flash_attn_shim",
    "openrlhf_losses",
]

log = logging.getLogger(__name__)

SHIM_VERSION = "0.0.0+tracerl.shim"
"""`flash_attn.__version__` of the stand-in; how to tell it from a real install."""


def ensure_flash_attn() -> bool:
    """Make `import flash_attn.bert_padding` and `flash_attn.utils.distributed` work.

    Does nothing when a real flash-attn (or this shim) is importable. Otherwise it imports
    transformers first (transformers probes `find_spec("flash_attn")` while importing, and a
    module without a `__spec__` breaks that probe), then installs the three modules in
    `sys.modules`, each with a proper `__spec__`.

    Returns:
        True if this call installed the shim, False if `flash_attn` was already importable.
    """
    if importlib.util.find_spec("flash_attn") is not None:
        return False
    import transformers  # noqa: F401  (see docstring: must come before the shim)

    package = _module("flash_attn", is_package=True)
    package.__version__ = SHIM_VERSION  # type: ignore[attr-defined]
    bert_padding = _module("flash_attn.bert_padding")
    bert_padding.index_first_axis = index_first_axis  # type: ignore[attr-defined]
    bert_padding.pad_input = pad_input  # type: ignore[attr-defined]
    bert_padding.unpad_input = unpad_input  # type: ignore[attr-defined]
    bert_padding.rearrange = _rearrange()  # type: ignore[attr-defined]
    utils = _module("flash_attn.utils", is_package=True)
    distributed = _module("flash_attn.utils.distributed")
    distributed.all_gather = all_gather  # type: ignore[attr-defined]
    package.bert_padding = bert_padding  # type: ignore[attr-defined]
    package.utils = utils  # type: ignore[attr-defined]
    utils.distributed = distributed  # type: ignore[attr-defined]
    for module in (package, bert_padding, utils, distributed):
        sys.modules[module.__name__] = module
    log.info("flash_attn is not installed: using trace-rl's pure-torch stand-in (%s)", SHIM_VERSION)
    return True


def flash_attn_installed() -> bool:
    """Whether the real flash-attn is installed (its distribution, not this module's stand-in).

    transformers decides the same way whether `flash_attention_2` is usable.
    """
    try:
        importlib.metadata.version("flash_attn")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class OpenRLHFLosses:
    """The pieces of `openrlhf.models` that the CPU trainer uses, unchanged."""

    PolicyLoss: type[Any]
    """`openrlhf.models.loss.PolicyLoss` (0.11.2: forward returns 5 values)."""
    compute_approx_kl: Callable[..., torch.Tensor]
    compute_entropy: Callable[[torch.Tensor], torch.Tensor]
    log_probs_from_logits: Callable[..., torch.Tensor]


def openrlhf_losses() -> OpenRLHFLosses:
    """Import OpenRLHF's policy loss and KL/entropy/log-prob helpers (the shim first, if needed).

    Raises:
        BackendUnavailable: OpenRLHF (or one of its light dependencies) is not installed.
    """
    ensure_flash_attn()
    try:
        from openrlhf.models.loss import PolicyLoss
        from openrlhf.models.utils import compute_approx_kl, compute_entropy, log_probs_from_logits
    except ImportError as err:
        raise BackendUnavailable(
            f"the trainer uses OpenRLHF's PolicyLoss, which failed to import ({err}). Install "
            "`pip install --no-deps openrlhf==0.11.2` and `pip install 'trace-rl[train]'`"
        ) from err
    return OpenRLHFLosses(PolicyLoss, compute_approx_kl, compute_entropy, log_probs_from_logits)


def is_flash_attn_shim() -> bool:
    """Whether the `flash_attn` in `sys.modules` is this module's stand-in."""
    module = sys.modules.get("flash_attn")
    return getattr(module, "__version__", None) == SHIM_VERSION


def _module(name: str, *, is_package: bool = False) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=is_package)
    if is_package:
        # An empty search path: submodules we do not provide (flash_attn.ops) fail to import.
        module.__path__ = []
    return module


def _rearrange():  # noqa: ANN202  (einops' own signature)
    from einops import rearrange

    return rearrange


def index_first_axis(tensor: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Rows `indices` of the flattened batch: `(total, ...) -> (len(indices), ...)`."""
    return tensor[indices]


def unpad_input(
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor,
    unused_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """Drop padding: `(B, T, ...)` to `(n_tokens, ...)`, as flash-attn 2.7's `unpad_input`.

    Returns:
        `(tokens, indices, cu_seqlens, max_seqlen, seqlens_in_batch)`, where `indices` index the
        kept tokens in the flattened `(B * T)` batch and `cu_seqlens` is `(B + 1,)` int32.
    """
    import torch
    import torch.nn.functional as F
    from einops import rearrange

    all_masks = attention_mask + unused_mask if unused_mask is not None else attention_mask
    seqlens = all_masks.sum(dim=-1, dtype=torch.int32)  # (B,)
    used_seqlens = attention_mask.sum(dim=-1, dtype=torch.int32)  # (B,)
    indices = torch.nonzero(all_masks.flatten(), as_tuple=False).flatten()  # (n_tokens,)
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))  # (B + 1,)
    flat = rearrange(hidden_states, "b s ... -> (b s) ...")  # (B * T, ...)
    return index_first_axis(flat, indices), indices, cu_seqlens, int(seqlens.max()), used_seqlens


def pad_input(
    hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int
) -> torch.Tensor:
    """Inverse of `unpad_input`: `(n_tokens, ...)` back to `(batch, seqlen, ...)` with zeros."""
    import torch
    from einops import rearrange

    out = torch.zeros(
        (batch * seqlen, *hidden_states.shape[1:]),
        device=hidden_states.device,
        dtype=hidden_states.dtype,
    )  # (B * T, ...)
    out[indices] = hidden_states
    return rearrange(out, "(b s) ... -> b s ...", b=batch)


def all_gather(
    tensor: torch.Tensor, process_group: torch.distributed.ProcessGroup | None = None
) -> torch.Tensor:
    """Concatenate `tensor` from every rank along dim 0 (itself when not distributed)."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(process_group) if dist.is_initialized() else 1
    if world == 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(world)]
    dist.all_gather(parts, tensor.contiguous(), group=process_group)
    return torch.cat(parts, dim=0)
