"""The DeepSpeed ZeRO optimizer wrapper: one process, gloo, CPU; the same update as AdamW.

Slow on a fresh machine: DeepSpeed's CPU accelerator JIT-builds its shared-memory comm op on
first use (measured here: about 3 minutes of wall time on a loaded 2-core VM, cached afterwards
in ~/.cache/torch_extensions; a cached engine starts in about 4 s).
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

pytest.importorskip("deepspeed")

from harness.training.optimizers import DeepSpeedOptimizer, TorchOptimizer

pytestmark = pytest.mark.slow

_RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")


@pytest.fixture(scope="module", autouse=True)
def rendezvous_variables():
    """Restore the rendezvous variables the wrapper sets.

    The one-process gloo group itself stays for the session: DeepSpeed caches its groups, and
    a destroyed default group breaks every later engine in the process.
    """
    before = {k: os.environ.get(k) for k in _RENDEZVOUS}
    yield
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _step(optimizer, ids: torch.Tensor) -> float:
    """One update from two micro-batches whose losses add up to the full batch's mean."""
    halves = (ids[:2], ids[2:])
    for k, half in enumerate(halves):
        loss = optimizer.model(input_ids=half, labels=half).loss / len(halves)
        optimizer.backward(loss, last=k == len(halves) - 1)
    return optimizer.step(1e-2)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_step_equals_adamw_and_its_state_round_trips(stage, tmp_path, tiny_model):
    reference = tiny_model()
    wrapped_model = copy.deepcopy(reference)
    ids = torch.randint(0, 50, (4, 12), generator=torch.Generator().manual_seed(1))  # (B, T)
    plain = TorchOptimizer(reference, lr=1e-2, grad_clip=1.0)
    zero = DeepSpeedOptimizer(wrapped_model, zero_stage=stage, lr=1e-2, grad_clip=1.0)
    norms = (_step(plain, ids), _step(zero, ids))
    assert norms[1] == pytest.approx(norms[0], rel=1e-5)
    for (name, a), b in zip(reference.named_parameters(), wrapped_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    # what checkpoints and the final policy save: whole tensors (gathered under ZeRO-3)
    saved = zero.model_state_dict()
    for name, tensor in reference.state_dict().items():
        torch.testing.assert_close(saved[name], tensor, rtol=1e-5, atol=1e-6, msg=name)

    # the state goes through a weights_only checkpoint into a fresh engine, which then steps
    # exactly as the original does
    torch.save(zero.state_dict(), tmp_path / "optimizer.pt")
    restored_model = copy.deepcopy(reference)
    restored = DeepSpeedOptimizer(restored_model, zero_stage=stage, lr=1e-2, grad_clip=1.0)
    restored.load_state_dict(torch.load(tmp_path / "optimizer.pt", weights_only=True))
    _step(plain, ids)
    _step(restored, ids)
    for (name, a), b in zip(reference.named_parameters(), restored_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_step_without_a_last_backward_is_an_error(tiny_model):
    zero = DeepSpeedOptimizer(tiny_model(), zero_stage=1, lr=1e-2)
    ids = torch.randint(0, 50, (2, 8))
    zero.backward(zero.model(input_ids=ids, labels=ids).loss, last=False)
    with pytest.raises(RuntimeError, match="last=True"):
        zero.step(1e-2)


def test_a_bad_stage_is_rejected_before_anything_starts(tiny_model):
    with pytest.raises(ValueError, match="stages 0 to 3"):
        DeepSpeedOptimizer(tiny_model(), zero_stage=4, lr=1e-2)


def test_one_process_leaves_no_rendezvous_port_for_child_processes(tiny_model, monkeypatch):
    # a MASTER_PORT written here was inherited by the runs this process launched (torchrun,
    # the data-parallel benchmark), which then bound the port this process's store held
    monkeypatch.delenv("MASTER_PORT", raising=False)
    DeepSpeedOptimizer(tiny_model(), zero_stage=0, lr=1e-2, grad_clip=1.0)
    assert torch.distributed.get_world_size() == 1
    assert "MASTER_PORT" not in os.environ
