"""OpenRLHF-integration tests: skipped without openrlhf; the flash_attn stand-in goes in first,
because these modules import openrlhf.models (harness/openrlhf/compat.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("openrlhf")

from harness.openrlhf.compat import ensure_flash_attn

ensure_flash_attn()
