"""An int8 ONNX Runtime copy of a transformers encoder, for fast query encoding on a CPU.

On a CPU the query encoder, not a compressed index, sets a retrieval server's ceiling (an
e5-base-v2 query costs about 2.8 GFLOP at 16 tokens). Measured side by side on one core
(benchmarks/RESULTS.md, "Wiki scale"), ONNX Runtime with dynamically quantised int8 weights
encodes an e5-shaped BERT-base faster than torch's own dynamic int8 quantisation and than bf16
autocast. `int8_session` exports the model once (torch's TorchScript-based ONNX exporter),
quantises its MatMul weights to int8 (`onnxruntime.quantization.quantize_dynamic`) and caches
the result under `cache_key`, so later starts only load it.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from retrieval.encoder import model_files
from retrieval.errors import EncoderError

__all__ = ["cache_key", "default_cache_dir", "int8_session"]

log = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """`~/.cache/trace-rl/onnx`, where quantised encoders are kept."""
    return Path.home() / ".cache" / "trace-rl" / "onnx"


def cache_key(fingerprint: str, model_dir: Path) -> str:
    """The name of a model's cached int8 file: its fingerprint and its files' sizes and mtimes.

    The fingerprint (`PooledEncoder.fingerprint`) samples the weights instead of hashing them;
    the modification times make weights rewritten in place (a fine-tune saved over the folder)
    export again. A copy of the folder with new times exports once more: slow, never wrong.
    Reading them is one `stat` per file, as Python's own bytecode cache checks its sources.
    """
    digest = hashlib.sha256(fingerprint.encode())
    for path in model_files(model_dir):
        stat = path.stat()
        digest.update(f"{path.relative_to(model_dir).as_posix()}|{stat.st_size}|".encode())
        digest.update(f"{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:16]


def int8_session(
    load_model: Callable[[], Any],
    fingerprint: str,
    *,
    cache_dir: Path | None = None,
    threads: int | None = None,
) -> Any:
    """An ONNX Runtime session running a transformers encoder with int8 weights.

    Args:
        load_model: loads the fp32 model, called only when no quantised copy is cached; the
            model is called as `model(input_ids=, attention_mask=)`, and its
            `last_hidden_state` is the session's one output, (B, L, hidden).
        fingerprint: names the cached file (`cache_key`).
        cache_dir: where the quantised file lives; None: `default_cache_dir()`.
        threads: ONNX Runtime's intra-op threads (None: its default, one per core).

    Raises:
        EncoderError: onnxruntime or onnx is missing, or the export fails.
    """
    try:
        import onnxruntime
        import torch
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as err:
        raise EncoderError(
            f"precision int8-onnx needs onnxruntime and onnx ({err}); pip install onnxruntime onnx"
        ) from err
    cache_dir = cache_dir or default_cache_dir()
    path = cache_dir / f"{fingerprint}-int8.onnx"
    if not path.is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)

        class _LastHidden(torch.nn.Module):  # type: ignore[misc]  # torch is read as Any
            def __init__(self, inner: Any) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, input_ids: Any, attention_mask: Any) -> Any:
                return self.inner(
                    input_ids=input_ids, attention_mask=attention_mask
                ).last_hidden_state

        ids = torch.ones((2, 8), dtype=torch.long)
        with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
            fp32 = Path(tmp) / "model.onnx"
            try:
                torch.onnx.export(
                    _LastHidden(load_model()).eval(),
                    (ids, torch.ones_like(ids)),
                    str(fp32),
                    input_names=["input_ids", "attention_mask"],
                    output_names=["last_hidden_state"],
                    dynamic_axes={
                        "input_ids": {0: "batch", 1: "length"},
                        "attention_mask": {0: "batch", 1: "length"},
                    },
                    opset_version=17,
                    dynamo=False,
                )
                partial = Path(tmp) / path.name
                quantize_dynamic(
                    str(fp32), str(partial), weight_type=QuantType.QInt8, per_channel=True
                )
            except Exception as err:  # the exporter raises many types; one clear message
                raise EncoderError(f"cannot export the encoder to ONNX: {err!r}") from err
            partial.replace(path)  # a cached file is always complete
        log.info("exported and quantised the encoder to %s", path)
    options = onnxruntime.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
