"""The flash_attn stand-in: OpenRLHF's models import and its PolicyLoss runs on CPU."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from harness.training.openrlhf_compat import index_first_axis, pad_input, unpad_input

pytest.importorskip("openrlhf")


def _run(code: str) -> str:
    """Run `code` in a fresh interpreter (the shim edits sys.modules) and return its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow  # a fresh interpreter imports OpenRLHF, DeepSpeed and transformers: 10-60 s
def test_openrlhf_models_needs_the_shim_and_then_policy_loss_and_kl_run():
    out = _run(
        """
        import importlib.util
        import json
        import torch
        real = importlib.util.find_spec("flash_attn") is not None
        try:
            import openrlhf.models  # noqa
            before = "imported"
        except ModuleNotFoundError as err:
            before = f"missing {err.name}"
        from harness.training.openrlhf_compat import ensure_flash_attn, is_flash_attn_shim
        first, second = ensure_flash_attn(), ensure_flash_attn()
        from openrlhf.models.loss import PolicyLoss
        from openrlhf.models.utils import compute_approx_kl
        from transformers.utils import is_flash_attn_2_available
        lp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
        old = torch.tensor([[-1.1, -2.0, -0.4]])
        adv = torch.tensor([[1.0, 1.0, 1.0]])
        mask = torch.tensor([[1.0, 1.0, 0.0]])
        values = PolicyLoss()(lp, old, adv, mask)
        values[0].backward()
        kl = compute_approx_kl(lp.detach(), old, kl_estimator="k3")
        print(json.dumps([real, before, first, second, is_flash_attn_shim(), len(values),
              lp.grad[0, 2].item(), lp.grad[0, 0].item() < 0, list(kl.shape),
              is_flash_attn_2_available()]))
        """
    )
    # DeepSpeed logs to stdout on import: the result is the last line
    real, before, first, second, shim, n_values, masked_grad, pushes_up, kl_shape, fa2 = json.loads(
        out.splitlines()[-1]
    )
    if real:
        pytest.skip("a real flash-attn is installed here; the shim is inactive")
    assert before == "missing flash_attn"  # OpenRLHF 0.11.2 imports it unconditionally
    assert (first, second, shim) == (True, False, True)
    assert n_values == 5  # OpenRLHF 0.11.2: loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio
    assert masked_grad == 0.0  # a masked token gets no gradient
    assert pushes_up  # a positive advantage raises the token's log-prob
    assert kl_shape == [1, 3]
    assert fa2 is False  # transformers is not fooled into using flash-attention kernels


def test_unpad_then_pad_is_the_identity_on_real_tokens():
    hidden = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)  # (B, T, H)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])  # (B, T)
    tokens, indices, cu, max_len, used = unpad_input(hidden, mask)
    assert tokens.shape == (5, 3) and cu.tolist() == [0, 2, 5] and max_len == 3
    assert used.tolist() == [2, 3]
    back = pad_input(tokens, indices, 2, 4)  # (B, T, H)
    assert torch.equal(back * mask[..., None], hidden * mask[..., None])
    assert torch.equal(index_first_axis(hidden.reshape(8, 3), indices), tokens)
