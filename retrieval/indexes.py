"""Opening any index by its directory or URL.

`load_index(dir)` dispatches on the manifest's kind; `make_retriever(spec)` also accepts a server
URL, which is how an environment switches from a local index to a remote one.
"""

from __future__ import annotations

import difflib
import logging
from pathlib import Path

from retrieval.base import Encoder, Retriever
from retrieval.bm25 import BM25Retriever
from retrieval.cache import CachedRetriever
from retrieval.client import HTTPRetriever
from retrieval.dense import DenseRetriever
from retrieval.errors import IndexFormatError
from retrieval.manifest import read_manifest
from retrieval.protocol import PROTOCOLS

__all__ = ["INDEX_CLASSES", "load_index", "make_retriever", "verify_index"]

log = logging.getLogger(__name__)

INDEX_CLASSES: dict[str, type[BM25Retriever] | type[DenseRetriever]] = {
    "bm25": BM25Retriever,
    "dense": DenseRetriever,
}
"""Manifest kind -> the class whose `load` reads that directory."""


def load_index(
    directory: str | Path,
    *,
    kind: str | None = None,
    encoder: Encoder | None = None,
    mmap: bool = False,
) -> BM25Retriever | DenseRetriever:
    """Load an index directory of any kind.

    Args:
        directory: a folder written by `tracerl index build` or an index's `save`.
        kind: if given, the kind the caller expects ("bm25" or "dense").
        encoder: for a dense index, the query encoder (None loads the manifest's).
        mmap: memory-map the arrays instead of reading them into memory.

    Raises:
        IndexFormatError: the folder is missing, has no valid manifest, or its files are bad.
        IndexMismatchError: the kind is not `kind`, or the files disagree with the manifest.
    """
    manifest = read_manifest(directory)
    if kind is not None:
        if kind not in INDEX_CLASSES:
            close = difflib.get_close_matches(kind, INDEX_CLASSES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown index kind {kind!r}{hint}; choose {list(INDEX_CLASSES)}")
        manifest.expect(kind=kind)
    if manifest.kind == "dense":
        return DenseRetriever.load(directory, encoder, mmap=mmap)
    if encoder is not None:
        raise ValueError(f"{directory} is a {manifest.kind} index; it takes no encoder")
    return BM25Retriever.load(directory, mmap=mmap)


def verify_index(directory: str | Path) -> None:
    """Hash every file of an index directory (any kind, compressed too) against its manifest.

    Raises:
        IndexFormatError: the directory has no valid manifest.
        IndexFileError: naming the missing, resized, changed or extra file.
    """
    from retrieval.compressed import COMPRESSED_NAME, check_compressed_files

    if (Path(directory) / COMPRESSED_NAME).is_file():
        check_compressed_files(directory, hashes=True)
    else:
        read_manifest(directory).check_files(directory, hashes=True)


def make_retriever(spec: str | Path, *, cache: bool = True) -> Retriever:
    """A retriever from a spec: an index directory, or the URL of a retrieval server.

    Args:
        spec: `http://…` / `https://…` gives an `HTTPRetriever` for a Search-R1-protocol
            server; `skyrl-gym+http://…` or `gem+http://…` one that speaks that peer's
            protocol (`retrieval.protocol`); anything else is an index directory for
            `load_index`.
        cache: wrap the retriever in a `CachedRetriever`, the shared cross-episode cache.

    Raises:
        IndexFormatError: `spec` is neither a URL nor an index directory.
        IndexMismatchError: the index's files disagree with its manifest.

    A URL's server is not contacted here: the index id is asked for on first use, so a
    retriever can be made before its server is up.
    """
    text = str(spec)
    protocol, plus, url = text.partition("+")
    if text.startswith(("http://", "https://")):
        retriever: Retriever = HTTPRetriever(text)
    elif plus and protocol in PROTOCOLS and url.startswith(("http://", "https://")):
        retriever = HTTPRetriever(url, protocol=protocol)
    elif Path(text).is_dir():
        retriever = load_index(text)
    else:
        raise IndexFormatError(
            f"retriever spec {text!r} is neither an http(s) URL (optionally prefixed "
            f"{' or '.join(p + '+' for p in PROTOCOLS[1:])}) nor an index directory"
        )
    log.info("retriever %s from %s", type(retriever).__name__, text)
    return CachedRetriever(retriever) if cache else retriever
