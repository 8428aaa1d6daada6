"""ONNX Runtime copies of a transformers encoder: a cached int8 one, and an exported folder.

On a CPU the query encoder, not a compressed index, sets a retrieval server's ceiling (an
e5-base-v2 query costs about 2.8 GFLOP at 16 tokens), and torch sets its start: importing torch
and transformers and building e5-base took most of a cold start (benchmarks/RESULTS.md, "Wiki
scale: a cold start without torch"; docs/decisions.md, "Query encoder"). Two routes here:

- `int8_session`: exports the model once (torch's TorchScript-based ONNX exporter), quantises
  its MatMul weights to int8 (`onnxruntime.quantization.quantize_dynamic`) and caches the result
  under `cache_key`, so later starts only load it (`PooledEncoder(precision="int8-onnx")`);
- `export_encoder` writes a folder (`tracerl index export-encoder`) that `OnnxEncoder` serves
  with onnxruntime and the `tokenizers` library only: a server process that never imports
  torch or transformers (docs/decisions.md, "Query encoder").

Both export `last_hidden_state` only; pooling (`pool`) and normalisation run in numpy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np

from retrieval.encoder import BatchedEncoder, model_files
from retrieval.errors import EncoderError

__all__ = [
    "EXPORT_NAME",
    "OnnxEncoder",
    "cache_key",
    "default_cache_dir",
    "export_encoder",
    "int8_session",
    "is_exported",
    "pool",
]

EXPORT_NAME = "onnx_encoder.json"
"""The record `export_encoder` writes; its presence marks an exported folder."""
_MODEL_NAME = "model.onnx"
_TOKENIZER_NAME = "tokenizer.json"
_SCHEMA_VERSION = 1

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


def _export(model: Any, path: Path, *, int8: bool) -> None:
    """Write `model`'s `last_hidden_state` as ONNX to `path` (int8 weights if `int8`).

    Raises:
        EncoderError: the exporter or the quantiser fails.
    """
    import torch

    class _LastHidden(torch.nn.Module):  # type: ignore[misc]  # torch is read as Any
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids = torch.ones((2, 8), dtype=torch.long)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        fp32 = Path(tmp) / "model.onnx"
        partial = Path(tmp) / path.name
        try:
            torch.onnx.export(
                _LastHidden(model).eval(),
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
            if int8:
                from onnxruntime.quantization import QuantType, quantize_dynamic

                quantize_dynamic(
                    str(fp32), str(partial), weight_type=QuantType.QInt8, per_channel=True
                )
            else:
                fp32.replace(partial)
        except ImportError as err:
            raise EncoderError(
                f"exporting to ONNX needs onnxruntime and onnx ({err}); "
                "pip install onnxruntime onnx"
            ) from err
        except Exception as err:  # the exporter raises many types; one clear message
            raise EncoderError(f"cannot export the encoder to ONNX: {err!r}") from err
        partial.replace(path)  # a written file is always complete


def _session(path: Path, threads: int | None) -> Any:
    try:
        import onnxruntime
    except ImportError as err:
        raise EncoderError(
            f"ONNX encoders need onnxruntime ({err}); pip install onnxruntime"
        ) from err
    options = onnxruntime.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


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
    cache_dir = cache_dir or default_cache_dir()
    path = cache_dir / f"{fingerprint}-int8.onnx"
    if not path.is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)
        _export(load_model(), path, int8=True)
        log.info("exported and quantised the encoder to %s", path)
    return _session(path, threads)


def pool(hidden: np.ndarray, mask: np.ndarray, pooling: str) -> np.ndarray:
    """Vectors (B, dim) from token states (B, L, dim) and their mask (B, L), not normalised.

    `mean` averages the states the mask keeps, `cls` takes the first token's.
    """
    if pooling == "mean":
        weights = mask[..., None].astype(np.float32)
        return np.asarray((hidden * weights).sum(1) / weights.sum(1), np.float32)
    return np.asarray(hidden[:, 0], np.float32)


def is_exported(folder: str | Path) -> bool:
    """Whether `folder` was written by `export_encoder`."""
    return (Path(folder) / EXPORT_NAME).is_file()


def export_encoder(
    model: str | Path | None,
    out: Path,
    *,
    precision: Literal["fp32", "int8"] = "fp32",
) -> dict[str, Any]:
    """Export a transformers encoder to a folder `OnnxEncoder` serves without torch.

    Writes `model.onnx` (the token states), `tokenizer.json` (the fast tokenizer, with its
    special tokens) and `onnx_encoder.json` (the source's `model_signature`, the hidden size,
    the padding token and the precision). Needs torch and transformers; serving does not.

    Args:
        model: the model folder (e5-base-v2, ...), or None for the packaged MiniLM.
        out: the folder to write (created; files already there are replaced).
        precision: fp32 (agrees with torch's fp32 to rounding), or int8 (ONNX Runtime's
            dynamic quantisation: faster, less faithful; docs/retrieval.md gives both).

    Returns:
        The record written to `onnx_encoder.json`.

    Raises:
        EncoderError: the folder is not a model, its tokenizer is not a fast one, or the export
            fails.
    """
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from retrieval.encoder import model_signature, resolve_model_dir

    if precision not in ("fp32", "int8"):
        raise EncoderError(f"precision {precision!r}: choose fp32 or int8")
    model_dir = resolve_model_dir(model)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
        torch_model = AutoModel.from_pretrained(str(model_dir), local_files_only=True).eval()
    except (OSError, ValueError) as err:
        raise EncoderError(f"cannot load encoder from {model_dir}: {err}") from err
    if not getattr(tokenizer, "is_fast", False) or tokenizer.pad_token is None:
        raise EncoderError(f"{model_dir}: a fast tokenizer with a padding token is needed")
    out.mkdir(parents=True, exist_ok=True)
    (out / EXPORT_NAME).unlink(missing_ok=True)  # the record goes last: it marks a whole export
    _export(torch_model, out / _MODEL_NAME, int8=precision == "int8")
    tokenizer.backend_tokenizer.save(str(out / _TOKENIZER_NAME))
    record: dict[str, Any] = {
        "schema_version": _SCHEMA_VERSION,
        "kind": "onnx-encoder",
        "source": str(model if model is not None else model_dir),
        "source_signature": model_signature(model_dir),
        "hidden_size": int(config.hidden_size),
        "max_positions": int(getattr(config, "max_position_embeddings", 512)),
        "precision": precision,
        "pad_token": tokenizer.pad_token,
        "pad_id": int(tokenizer.pad_token_id),
    }
    (out / EXPORT_NAME).write_text(json.dumps(record, indent=2) + "\n")
    log.info("exported %s (%s) to %s", model_dir, precision, out)
    return record


class OnnxEncoder(BatchedEncoder):
    """An exported encoder (`export_encoder`), run by ONNX Runtime: no torch, no transformers.

    Meets `retrieval.Encoder` as `retrieval.prebuilt.PooledEncoder` does (`BatchedEncoder`),
    with the same tokenisation (the model's own fast tokenizer: padding, truncation at
    `max_length`, special tokens), pooling and unit norm. Its name is the folder; its
    fingerprint, a hash of the source's `model_signature`, the pooling, the length and the
    precision.

    Args:
        folder: written by `export_encoder`.
        pooling: `mean` (e5) or `cls` (bge); token states only, so no `pooler`.
        max_length: truncate inputs to this many tokens (Search-R1's query default: 256).
        batch_size: texts per session run.
        threads: ONNX Runtime's intra-op threads (None: one per core).

    Raises:
        EncoderError: the folder is not an export, or onnxruntime / tokenizers is missing.
    """

    def __init__(
        self,
        folder: str | Path,
        *,
        pooling: str = "mean",
        max_length: int = 256,
        batch_size: int = 64,
        threads: int | None = None,
    ) -> None:
        self._folder = Path(folder)
        if pooling not in ("mean", "cls"):
            raise EncoderError(f"pooling {pooling!r}: an exported encoder pools mean or cls")
        try:
            record: dict[str, Any] = json.loads((self._folder / EXPORT_NAME).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise EncoderError(
                f"{self._folder}: no readable {EXPORT_NAME} ({err}); write one with "
                "`tracerl index export-encoder`"
            ) from err
        if record.get("schema_version") != _SCHEMA_VERSION or record.get("kind") != "onnx-encoder":
            raise EncoderError(
                f"{self._folder}: not an exported encoder of schema {_SCHEMA_VERSION}"
            )
        if not 1 <= max_length <= record["max_positions"]:
            raise EncoderError(
                f"max_length {max_length}: the model takes 1..{record['max_positions']} tokens"
            )
        try:
            from tokenizers import Tokenizer
        except ImportError as err:
            raise EncoderError(f"ONNX encoders need tokenizers ({err})") from err
        self._tokenizer = Tokenizer.from_file(str(self._folder / _TOKENIZER_NAME))
        self._tokenizer.enable_truncation(max_length)
        self._tokenizer.enable_padding(pad_id=record["pad_id"], pad_token=record["pad_token"])
        self._session = _session(self._folder / _MODEL_NAME, threads)
        self._record = record
        self.pooling = pooling
        self.max_length = max_length
        super().__init__(
            name=str(self._folder),
            fingerprint=hashlib.sha256(
                f"{record['source_signature']}|{pooling}|{max_length}|onnx-{record['precision']}".encode()
            ).hexdigest()[:16],
            dim=int(record["hidden_size"]),
            batch_size=batch_size,
        )

    @property
    def precision(self) -> str:
        """fp32 or int8, as exported."""
        return str(self._record["precision"])

    def _embed(self, batch: list[str]) -> np.ndarray:
        encoded = self._tokenizer.encode_batch(batch)
        ids = np.array([e.ids for e in encoded], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
        (hidden,) = self._session.run(None, {"input_ids": ids, "attention_mask": mask})
        return pool(hidden, mask, self.pooling)
