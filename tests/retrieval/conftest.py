"""Fixtures of the retrieval tests: a small corpus with known answers, and a counting fake."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from retrieval import BM25Retriever, Document, Hit

TOY_DOCS = [
    Document(doc_id="d0", title="Paris", text="Paris is the capital and largest city of France."),
    Document(doc_id="d1", title="Rome", text="Rome is the capital city of Italy."),
    Document(doc_id="d2", title="Berlin", text="Berlin is the capital of Germany."),
    Document(doc_id="d3", title="Seine", text="The Seine is a river that flows through Paris."),
    Document(doc_id="d4", title="Tiber", text="The Tiber is the river of Rome."),
    Document(
        doc_id="d5", title="Alps", text="The Alps are mountains in Europe, in France and Italy."
    ),
    Document(doc_id="d6", title="Zuse", text="Konrad Zuse built the Z3 computer in Berlin."),
    Document(doc_id="d7", title="Café", text="A café serves coffee; Ｐａｒｉｓ has many cafés."),
]


@pytest.fixture(scope="session")
def toy_docs() -> list[Document]:
    return list(TOY_DOCS)


@pytest.fixture(scope="session")
def toy_bm25() -> BM25Retriever:
    return BM25Retriever.build(TOY_DOCS)


class CountingRetriever:
    """A fake `Retriever`: hit i of query q is `q#i`, and every call is recorded."""

    def __init__(self, index_id: str = "fake-1", *, fail: bool = False) -> None:
        self._index_id = index_id
        self.fail = fail
        self.calls: list[tuple[list[str], int]] = []
        self._lock = threading.Lock()

    @property
    def index_id(self) -> str:
        return self._index_id

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        with self._lock:
            self.calls.append((list(queries), k))
        if self.fail:
            from retrieval import RetrieverUnavailable

            raise RetrieverUnavailable("fake outage")
        return [
            [
                Hit(doc_id=f"{q}#{i}", title=q, text=f"text {i}", score=float(k - i))
                for i in range(k)
            ]
            for q in queries
        ]


@pytest.fixture
def counting() -> CountingRetriever:
    return CountingRetriever()


@pytest.fixture
def counting_cls() -> type[CountingRetriever]:
    return CountingRetriever


class HashEncoder:
    """A fake `Encoder`: a text's vector is drawn from a RNG seeded by the text's hash.

    Equal texts get equal vectors and distinct texts near-orthogonal ones, so a query equal to
    a passage finds that passage first. `texts` records every text encoded.
    """

    def __init__(self, dim: int = 32, name: str = "hash-encoder") -> None:
        self._dim = dim
        self._name = name
        self.texts: list[str] = []

    @property
    def name(self) -> str:
        return self._name

    @property
    def fingerprint(self) -> str:
        return f"{self._name}-{self._dim}"

    @property
    def dim(self) -> int:
        return self._dim

    def encode(self, texts, *, progress: bool = False):
        import hashlib

        import numpy as np

        self.texts.extend(texts)
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
            row = np.random.default_rng(seed).standard_normal(self._dim)
            rows.append(row / np.linalg.norm(row))
        return np.asarray(rows, dtype=np.float32).reshape(len(texts), self._dim)


@pytest.fixture
def hash_encoder() -> HashEncoder:
    return HashEncoder()


@pytest.fixture
def hash_encoder_cls() -> type[HashEncoder]:
    return HashEncoder


@pytest.fixture(scope="session")
def minilm():
    """The packaged MiniLM encoder, loaded once (offline)."""
    from retrieval import SentenceEncoder

    return SentenceEncoder()


class ServerProcess:
    """`tracerl serve-retriever` in a subprocess, started on 127.0.0.1 and a free port."""

    def __init__(self, index_dir, log_path, *extra: str) -> None:
        self.index_dir = index_dir
        self.log_path = log_path
        self.extra = extra
        self.proc = None
        self.url = None

    def start(self, port: int = 0, timeout_s: float = 120.0) -> str:
        import queue
        import re
        import subprocess
        import sys
        import threading

        cmd = [
            sys.executable,
            "-m",
            "benchmarks.cli",
            "serve-retriever",
            "--index",
            str(self.index_dir),
        ]
        cmd += ["--port", str(port), *self.extra]
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed by the child's exit
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
        lines: queue.Queue[str] = queue.Queue()

        def pump(stream) -> None:
            for line in stream:
                lines.put(line)
            lines.put("")

        threading.Thread(target=pump, args=(self.proc.stdout,), daemon=True).start()
        while True:
            try:
                line = lines.get(timeout=timeout_s)
            except queue.Empty:
                self.kill()
                raise RuntimeError(f"server did not start in {timeout_s} s") from None
            if not line:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-2000:]}")
            found = re.search(r"ready at (http://\S+)", line)
            if found:
                self.url = found.group(1)
                return self.url

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except Exception:
                self.proc.kill()
                self.proc.wait(timeout=30)


@pytest.fixture(scope="session")
def toy_index_dir(tmp_path_factory, toy_bm25):
    path = tmp_path_factory.mktemp("toy-index") / "bm25"
    toy_bm25.save(path)
    return path


@pytest.fixture(scope="session")
def server_cls() -> type[ServerProcess]:
    return ServerProcess


@pytest.fixture(scope="session")
def toy_server(tmp_path_factory, toy_index_dir):
    """One BM25 server over the toy corpus, shared by the tests that only read from it."""
    server = ServerProcess(toy_index_dir, tmp_path_factory.mktemp("logs") / "toy-server.log")
    server.start()
    yield server
    server.stop()


def synthetic_docs(n: int, seed: int = 0) -> list[Document]:
    """`n` seeded pseudo-word passages: a shared vocabulary, so queries match many documents."""
    import numpy as np

    rng = np.random.default_rng(seed)
    syllables = ["ka", "lo", "mi", "ren", "tu", "sa", "vor", "el", "dan", "qui", "bra", "ost"]
    vocab = sorted({"".join(rng.choice(syllables, size=3)) for _ in range(600)})
    docs = []
    for i in range(n):
        words = rng.choice(vocab, size=int(rng.integers(12, 40)))
        docs.append(Document(doc_id=f"s{i}", title=" ".join(words[:2]), text=" ".join(words)))
    return docs


def synthetic_queries(n: int, seed: int = 1) -> list[str]:
    """Queries made of words from `synthetic_docs(…, seed=0)`'s vocabulary."""
    import numpy as np

    docs = synthetic_docs(200)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        words = docs[int(rng.integers(len(docs)))].text.split()
        out.append(" ".join(rng.choice(words, size=int(rng.integers(1, 5)))))
    return out


@pytest.fixture(scope="session")
def synthetic_index(tmp_path_factory):
    """A BM25 index over 3,000 synthetic passages, saved; returns (retriever, directory)."""
    retriever = BM25Retriever.build(synthetic_docs(3000))
    path = tmp_path_factory.mktemp("synthetic-index") / "bm25"
    retriever.save(path)
    return retriever, path


@pytest.fixture(scope="session")
def query_maker():
    return synthetic_queries


class AppServer:
    """An ASGI app served by uvicorn in a thread, on a listening socket the test owns.

    The socket is bound to 127.0.0.1 port 0 (the OS picks the port) by the caller, and each
    server gets a duplicate of it: stopping one server closes its duplicate only, so the port
    stays bound, connections queue in its backlog, and the next server started on the same
    socket is a server restarted at the same URL.
    """

    def __init__(self, app, sock) -> None:
        import uvicorn

        self._sock = sock.dup()
        config = uvicorn.Config(app, log_level="error", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def __enter__(self) -> AppServer:
        import time

        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:  # the lifespan (the batcher) is up once this is set
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the app server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self._sock.close()


@pytest.fixture
def listening_socket():
    """A TCP socket listening on 127.0.0.1, its port picked by the OS; closed after the test."""
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    yield sock
    sock.close()


@pytest.fixture(scope="session")
def app_server_cls() -> type[AppServer]:
    return AppServer
