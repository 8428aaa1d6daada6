"""`tracerl doctor`: check a machine, its toolchain and a run's layout before anything starts.

A first cluster run fails late and far from its cause when the box is not ready: a driver too old
for torch's CUDA makes torch see no GPU, a CUDA 12 `nvcc` stops the flash-attn and FusedAdam
builds, a `ninja` off `PATH` makes them serial or impossible, a loopback retriever on a 2-node
run trains nothing. Each check here is a small function of injected `Probes` (a `which`, a
command's output, the environment, the Python version, the free disk, the mount table, a
`/health` call), so tests put fake binaries on `PATH` and fake values in, and one `Check` comes
back: its status and, when it is not ok, one line that names the fix.

On a machine without a GPU the GPU checks are skipped with "no GPU" (a failure with
`require_gpu`, as `make install-gpu`, the smoke and the launcher ask). `node_report` and
`compare_nodes` are the multi-node part: the launcher runs `node_report` on every node as one Ray
task each and `compare_nodes` turns the answers into checks (docs/openrlhf.md, "Preflight").
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import ipaddress
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from harness.training.lock_file import drift, read_lock

__all__ = [
    "MIN_DRIVER",
    "SHARED_FS_TYPES",
    "Check",
    "Mount",
    "Probes",
    "Target",
    "compare_nodes",
    "format_report",
    "is_loopback_url",
    "mount_of",
    "node_report",
    "run_checks",
]

Status = Literal["ok", "warn", "fail", "skip"]

MIN_DRIVER: dict[int, int] = {13: 580, 12: 525}
"""The oldest NVIDIA driver (major) that runs each CUDA major (NVIDIA's compatibility table)."""
GPU_CUDA = "13.0"
"""The CUDA of the GPU install's torch 2.13.0 and vLLM 0.29.0 (PyPI's builds), used when the
installed torch is a CPU build."""
MIN_PYTHON = (3, 11)  # tomllib (scripts/gpu_pin.py) and the project's own floor
MIN_GCC = 10  # DeepSpeed compiles with -std=c++20 against torch >= 2.12
BUSY_GPU_SHARE = 0.1  # a GPU with more memory in use than this is held by another process
LOCKS_DIR = Path(__file__).resolve().parents[2] / "requirements"
"""The committed locks (docs/decisions.md, "Locked installs"); absent without the repository."""
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
SHARED_FS_TYPES = frozenset(
    {
        *("nfs", "nfs4", "cifs", "smb3", "smbfs", "afs"),  # network filesystems
        *("lustre", "gpfs", "beegfs", "panfs", "wekafs", "orangefs", "ceph", "glusterfs"),
        *("fuse.ceph-fuse", "fuse.glusterfs", "fuse.juicefs", "fuse.sshfs"),  # their FUSE clients
    }
)
"""Filesystem types (`/proc/mounts`' third field) that every node of a cluster can mount as one
filesystem. Any other type (ext4, xfs, overlay, tmpfs, ...) is taken as this node's own disk;
`Target.shared_fs` (`--shared-fs TYPE`) adds a type."""
WEIGHT_FILES = ("*.safetensors", "*.bin")
"""A model folder holds its weights in files like these (or names them in a `*.index.json`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    """One check's outcome."""

    name: str
    status: Status
    detail: str
    """What was found."""
    fix: str = ""
    """What to do, when the status is not ok."""

    def line(self) -> str:
        """One line: status, name, what was found and the fix."""
        fix = f" -> {self.fix}" if self.fix else ""
        return f"{self.status.upper():<4} {self.name}: {self.detail}{fix}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """What the run expects of this machine (every field is a `tracerl doctor` flag)."""

    require_gpu: bool = False
    """A missing GPU, driver, nvcc or Ray is a failure, not a skip (GPU installs and runs)."""
    checkpoint_dir: Path = Path("runs")
    """Where the run writes checkpoints: its free disk is checked."""
    min_disk_gb: float = 10.0
    """Free disk the run needs there (an 8B run keeps ~0.5 TB of checkpoints; docs/openrlhf.md)."""
    model: str | None = None
    """The model: a local directory every node can read, or a hub id (a warning)."""
    data: Path | None = None
    """The prompt folder (`scripts/prepare_hotpotqa.py --out`): must hold train.jsonl."""
    retriever: str | None = None
    """The retriever URL (or index directory) the run uses."""
    index_id: str | None = None
    """The index id the retriever's `/health` must report (unset: any)."""
    nodes: int = 1
    """Nodes of the run: with more than one, a loopback retriever URL is refused, and so is a
    checkpoint folder on this node's own disk."""
    shared_fs: tuple[str, ...] = ()
    """Filesystem types to count as shared besides the known network and cluster ones
    (`SHARED_FS_TYPES`: NFS, Lustre, GPFS, BeeGFS, CephFS, ...): `--shared-fs TYPE` for yours."""

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError(f"--nodes {self.nodes}: must be >= 1")


@dataclass(frozen=True, kw_only=True)
class Probes:
    """Everything the checks look at, injectable (`Probes.local()` is this machine)."""

    environ: Mapping[str, str]
    python: tuple[int, int]
    python_header: Path
    venv_bin: Path
    """The folder of the running interpreter (a venv's `bin`, where pip puts `ninja`)."""
    torch_cuda: Callable[[], str | None]
    """`torch.version.cuda` (None: a CPU build or no torch); lazy, importing torch takes seconds."""
    version: Callable[[str], str | None]
    """An installed distribution's version, or None."""
    disk_free: Callable[[Path], int]
    """Free bytes on the volume of an existing path."""
    health: Callable[[str], Mapping[str, Any]]
    """GET {url}/health; raises when there is no answer."""
    which: Callable[[str], str | None] = field(default=lambda name: None)
    output: Callable[[Sequence[str]], str | None] = field(default=lambda argv: None)
    """A command's stdout, or None when it is missing, fails or hangs."""
    mounts: Callable[[], str | None] = field(default=lambda: None)
    """The mount table (`/proc/mounts`' text), or None where there is none (macOS)."""

    @classmethod
    def local(cls, environ: Mapping[str, str] | None = None) -> Probes:
        """This machine's probes; `environ` (default `os.environ`) gives PATH and CUDA_HOME."""
        env = dict(os.environ if environ is None else environ)
        path = env.get("PATH", "")

        def which(name: str) -> str | None:
            return shutil.which(name, path=path)

        def output(argv: Sequence[str]) -> str | None:
            exe = argv[0] if "/" in argv[0] else which(argv[0])
            if exe is None:
                return None
            try:
                done = subprocess.run(
                    [exe, *argv[1:]], capture_output=True, text=True, timeout=30, env=env
                )
            except (OSError, subprocess.TimeoutExpired):
                return None
            return done.stdout if done.returncode == 0 else None

        return cls(
            environ=env,
            python=(sys.version_info.major, sys.version_info.minor),
            python_header=Path(sysconfig.get_paths()["include"]) / "Python.h",
            venv_bin=Path(sys.executable).parent,
            torch_cuda=_torch_cuda,
            version=_version,
            disk_free=lambda p: shutil.disk_usage(p).free,
            health=_health,
            which=which,
            output=output,
            mounts=_proc_mounts,
        )


def _proc_mounts() -> str | None:
    try:
        return Path("/proc/mounts").read_text(encoding="utf-8")
    except OSError:
        return None


@dataclass(frozen=True, slots=True)
class Mount:
    """One line of the mount table: where a filesystem is mounted and its type."""

    point: Path
    fstype: str

    def __str__(self) -> str:
        return f"{self.point} ({self.fstype})"


def mount_of(path: Path, table: str) -> Mount | None:
    """The mount that holds `path` (absolute, symlinks resolved), or None.

    The deepest mount point above it wins, and the last one listed where several share a point
    (a later mount hides an earlier one).

    >>> mount_of(Path("/shared/runs"), "/dev/sda1 / ext4 rw 0 0\\nsrv:/x /shared nfs4 rw 0 0")
    Mount(point=PosixPath('/shared'), fstype='nfs4')
    """
    found: Mount | None = None
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        # the table writes a space in a path as \040 (octal escapes)
        point = Path(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1]))
        if (point == path or point in path.parents) and (
            found is None or len(point.parts) >= len(found.point.parts)
        ):
            found = Mount(point, fields[2])
    return found


def _nearest_existing(path: Path) -> Path:
    """`path` made absolute, or its nearest existing parent, with symlinks resolved."""
    where = path.absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    return where.resolve()


def _torch_cuda() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    cuda: str | None = torch.version.cuda
    return cuda


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _health(url: str) -> Mapping[str, Any]:
    from retrieval.client import HTTPRetriever

    protocol, plus, rest = url.partition("+")
    if plus and rest.startswith(("http://", "https://")):
        return HTTPRetriever(rest, protocol=protocol, max_attempts=1, deadline_s=10).health()  # type: ignore[arg-type]
    return HTTPRetriever(url, max_attempts=1, deadline_s=10).health()


# --- the checks --------------------------------------------------------------------------------


def check_python(p: Probes, t: Target) -> Check:
    """Python >= 3.11 with its headers (`Python.h`: every just-in-time build includes it)."""
    found = f"{p.python[0]}.{p.python[1]}"
    want = f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]}"
    if p.python < MIN_PYTHON:
        return Check(
            name="python",
            status="fail",
            detail=f"Python {found} is older than {want}",
            fix=f"install python{want} with python{want}-venv and python{want}-dev, then "
            f"`make install-gpu PYTHON=python{want}`",
        )
    if not p.python_header.exists():
        return Check(
            name="python",
            status="fail",
            detail=f"Python {found} has no headers ({p.python_header} is missing)",
            fix=f"install python{found}-dev: FusedAdam's and Triton's builds include Python.h",
        )
    return Check(name="python", status="ok", detail=f"Python {found} with headers")


def check_gcc(p: Probes, t: Target) -> Check:
    """A gcc of version 10 or later (DeepSpeed's just-in-time builds use C++20)."""
    text = p.output(["gcc", "-dumpversion"])
    major = _major(text)
    if major is None:
        return Check(
            name="gcc",
            status="fail" if t.require_gpu else "warn",
            detail="no gcc on PATH",
            fix="install build-essential (gcc >= 10): flash-attn and FusedAdam compile with it",
        )
    if major < MIN_GCC:
        return Check(
            name="gcc",
            status="fail",
            detail=f"gcc {text.strip() if text else major} is older than {MIN_GCC}",
            fix=f"install gcc >= {MIN_GCC} (DeepSpeed builds with -std=c++20), first on PATH",
        )
    return Check(name="gcc", status="ok", detail=f"gcc {major}")


def check_ninja(p: Probes, t: Target) -> Check:
    """`ninja` on PATH: torch's extension builder looks nowhere else."""
    found = p.which("ninja")
    if found is None:
        return Check(
            name="ninja",
            status="fail" if t.require_gpu else "warn",
            detail="ninja is not on PATH (torch's builds look only there)",
            fix=f"export PATH={p.venv_bin}:$PATH (pip puts ninja there), or install ninja-build; "
            "start `ray start` from that shell too",
        )
    return Check(name="ninja", status="ok", detail=found)


def check_driver(p: Probes, t: Target) -> Check:
    """The NVIDIA driver is new enough for torch's CUDA (13.0: >= 580)."""
    text = p.output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if text is None:
        return _no_gpu("driver", t)
    driver = text.strip().splitlines()[0].strip() if text.strip() else ""
    cuda = p.torch_cuda() or GPU_CUDA
    cuda_major, driver_major = _major(cuda), _major(driver)
    need = MIN_DRIVER.get(cuda_major or 0)
    if driver_major is None or need is None:
        return Check(
            name="driver", status="warn", detail=f"driver {driver!r}, CUDA {cuda}: not checked"
        )
    if driver_major < need:
        return Check(
            name="driver",
            status="fail",
            detail=f"NVIDIA driver {driver} is older than {need}, which CUDA {cuda} needs "
            "(torch sees no GPU)",
            fix=f"upgrade the driver to >= {need}, or on data-centre GPUs install "
            f"cuda-compat-{cuda_major}-0",
        )
    return Check(name="driver", status="ok", detail=f"driver {driver} runs CUDA {cuda}")


def check_nvcc(p: Probes, t: Target) -> Check:
    """`nvcc`'s major version equals torch's CUDA major (flash-attn refuses a mismatch)."""
    cuda = p.torch_cuda()
    if cuda is None:
        if t.require_gpu:
            return Check(
                name="nvcc",
                status="fail",
                detail="torch is a CPU build (or missing)",
                fix="`make install-gpu` in a fresh venv (`make clean` first if .venv holds the "
                "CPU install)",
            )
        return Check(name="nvcc", status="skip", detail="no GPU: torch is a CPU build")
    home = p.environ.get("CUDA_HOME") or p.environ.get("CUDA_PATH")
    nvcc = str(Path(home) / "bin" / "nvcc") if home else "nvcc"
    text = p.output([nvcc, "--version"])
    found = re.search(r"release (\d+)\.(\d+)", text or "")
    if found is None:
        return Check(
            name="nvcc",
            status="fail",
            detail=f"no nvcc ({nvcc}); torch is built for CUDA {cuda}",
            fix=f"install the CUDA {cuda} toolkit and set CUDA_HOME to it",
        )
    release = f"{found.group(1)}.{found.group(2)}"
    if int(found.group(1)) != _major(cuda):
        return Check(
            name="nvcc",
            status="fail",
            detail=f"nvcc {release}, but torch is built for CUDA {cuda} (flash-attn and "
            "FusedAdam will not build)",
            fix=f"install the CUDA {cuda} toolkit and point CUDA_HOME (and PATH) at it",
        )
    return Check(name="nvcc", status="ok", detail=f"nvcc {release} matches torch's CUDA {cuda}")


def check_gpus(p: Probes, t: Target) -> Check:
    """GPUs are visible and no other process holds their memory."""
    text = p.output(
        [
            "nvidia-smi",
            "--query-gpu=index,memory.used,memory.total",
            "--format=csv,noheader,nounits",
        ]
    )
    if text is None:
        return _no_gpu("gpus", t)
    rows = [[c.strip() for c in line.split(",")] for line in text.strip().splitlines() if line]
    if not rows:
        return Check(
            name="gpus",
            status="fail",
            detail="nvidia-smi lists no GPU",
            fix="check CUDA_VISIBLE_DEVICES and the node's GPUs (nvidia-smi -L)",
        )
    busy = [r for r in rows if len(r) == 3 and float(r[1]) > BUSY_GPU_SHARE * float(r[2])]
    if busy:
        held = ", ".join(f"GPU {r[0]} {r[1]} of {r[2]} MiB" for r in busy)
        return Check(
            name="gpus",
            status="warn",
            detail=f"memory in use by another process: {held}",
            fix="free them (nvidia-smi shows the process; a stale Ray: `ray stop`)",
        )
    return Check(name="gpus", status="ok", detail=f"{len(rows)} GPUs, memory free")


def check_disk(p: Probes, t: Target) -> Check:
    """Free disk on the mount that holds the checkpoint folder; a missing folder is named.

    A folder that does not exist yet is a warning (a fresh run creates it), which says which
    mount would hold it: `/shared/runs` on an unmounted `/shared` would land on `/`.
    """
    folder = t.checkpoint_dir.absolute()
    where = _nearest_existing(folder)
    table = p.mounts()
    mount = mount_of(where, table) if table is not None else None
    free_gb = p.disk_free(where) / 1e9
    free = f"{free_gb:.0f} GB free on {mount or where}"
    if folder.exists():
        detail = f"{free}, which holds {folder}"
    else:
        detail = f"{folder} does not exist; {free}, which would hold it"
    if free_gb < t.min_disk_gb:
        return Check(
            name="disk",
            status="fail",
            detail=f"{detail}; the run needs {t.min_disk_gb:.0f} GB",
            fix="free space there, or point the checkpoints (CKPT, RUN) at a larger volume"
            + ("" if folder.exists() else " (is the volume meant for them mounted?)"),
        )
    if not folder.exists():
        return Check(
            name="disk",
            status="warn",
            detail=detail,
            fix=f"mount the volume meant for checkpoints, or `mkdir -p {folder}` on it",
        )
    return Check(name="disk", status="ok", detail=detail)


def check_shared_disk(p: Probes, t: Target) -> Check:
    """With several nodes, the checkpoint folder is on a filesystem that every node mounts.

    ZeRO-3 ranks on every node write their shards into one checkpoint folder and read them all
    back on resume: on a node's own disk each node would hold only its own ranks' shards.
    """
    if t.nodes < 2:
        return Check(name="shared disk", status="skip", detail="one node")
    folder = t.checkpoint_dir.absolute()
    table = p.mounts()
    mount = mount_of(_nearest_existing(folder), table) if table is not None else None
    if mount is None:
        return Check(
            name="shared disk",
            status="warn",
            detail=f"no mount table here: whether {folder} is shared is not checked",
        )
    if mount.fstype in SHARED_FS_TYPES or mount.fstype in t.shared_fs:
        return Check(name="shared disk", status="ok", detail=f"{folder} is on {mount}")
    return Check(
        name="shared disk",
        status="fail",
        detail=f"{folder} is on {mount}, this node's own disk, but the run has {t.nodes} "
        "nodes: each node's ranks would write their checkpoint shards to their own disk",
        fix="put RUN and CKPT on a filesystem every node mounts (NFS, Lustre, ...); if "
        f"{mount.fstype} is one, pass --shared-fs {mount.fstype}",
    )


def check_lock(p: Probes, t: Target) -> Check:
    """The installed versions against the lock the install was made from.

    A GPU venv (a CUDA torch, or `require_gpu`) is compared with `requirements/gpu.lock`, which
    `make install-gpu` takes as constraints; a CPU venv with `requirements/cpu.lock`, which `make
    install` installs exactly. A locked package that is not installed is no drift (flash-attn under
    `FLASH_ATTN=0`); one installed at another version is.
    """
    gpu = t.require_gpu or p.torch_cuda() is not None
    path = LOCKS_DIR / ("gpu.lock" if gpu else "cpu.lock")
    if not path.exists():
        detail = f"no {path.name} beside the package (trace-rl installed without its repository)"
        return Check(name="lock", status="skip", detail=detail)
    try:
        locked = read_lock(path)
    except ValueError as error:
        return Check(name="lock", status="fail", detail=str(error), fix="restore it from git")
    installed = {name: v for name in locked if (v := p.version(name)) is not None}
    moved = drift(locked, installed)
    moved = [d for d in moved if d.installed is not None]
    if not moved:
        detail = f"{len(installed)} installed packages at their {path.name} versions"
        return Check(name="lock", status="ok", detail=detail)
    shown = ", ".join(f"{d.name} {d.installed} (locked {d.locked})" for d in moved[:5])
    more = f" and {len(moved) - 5} more" if len(moved) > 5 else ""
    recipe = "make clean install-gpu" if gpu else "make clean install"
    return Check(
        name="lock",
        status="warn",
        detail=f"{len(moved)} packages differ from {path.name}: {shown}{more}",
        fix=f"`{recipe}` reinstalls the locked set; `make lock` if the new versions are intended",
    )


def check_ray(p: Probes, t: Target) -> Check:
    """Ray is installed (its version on every node is compared by `compare_nodes`)."""
    version = p.version("ray")
    if version is None:
        if t.require_gpu:
            return Check(
                name="ray",
                status="fail",
                detail="ray is not installed",
                fix="`make install-gpu`",
            )
        return Check(name="ray", status="skip", detail="ray is not installed")
    return Check(name="ray", status="ok", detail=f"ray {version}")


def check_model(p: Probes, t: Target) -> Check:
    """The model is a local folder with a config, or (a warning) a hub id."""
    if t.model is None:
        return Check(name="model", status="skip", detail="not asked (--model)")
    path = Path(t.model)
    if path.is_dir():
        if not (path / "config.json").exists():
            return Check(
                name="model",
                status="fail",
                detail=f"{path} has no config.json",
                fix="point MODEL at the model's folder (the one holding config.json)",
            )
        missing = _missing_weights(path)
        if missing:
            return Check(
                name="model",
                status="fail",
                detail=f"{path} {missing}",
                fix=f"download the whole model (`hf download ID --local-dir {path}`) or point "
                "MODEL at a folder that holds its weights",
            )
        return Check(name="model", status="ok", detail=f"{path.absolute()}")
    if _HUB_ID.fullmatch(t.model) and not t.model.startswith("."):
        offline = p.environ.get("HF_HUB_OFFLINE", "") in ("1", "true", "True")
        return Check(
            name="model",
            status="warn",
            detail=f"{t.model} is a hub id"
            + (
                ": HF_HUB_OFFLINE is set, so every node's hub cache must hold it"
                if offline
                else ": every rank on every node downloads it"
            ),
            fix="download it once (`hf download ID --local-dir /shared/models/NAME`) and pass "
            "MODEL=/shared/models/NAME",
        )
    return Check(
        name="model",
        status="fail",
        detail=f"{t.model} does not exist",
        fix="pass MODEL=a folder every node can read (a shared filesystem)",
    )


def _missing_weights(folder: Path) -> str | None:
    """What is missing of a model folder's weights (None: they are all there)."""
    indexes = sorted(folder.glob("*.index.json"))
    for index in indexes:  # a sharded model: every shard its index names
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError) as err:
            return f"has an unreadable {index.name} ({type(err).__name__}: {err})"
        absent = sorted(s for s in shards if not (folder / s).is_file())
        if absent:
            return (
                f"lacks {len(absent)} of the {len(shards)} shards {index.name} names "
                f"({absent[0]}, ...)"
            )
    if indexes or any(next(folder.glob(pattern), None) for pattern in WEIGHT_FILES):
        return None
    return "has config.json but no weights (no *.safetensors, *.bin or *.index.json)"


def check_data(p: Probes, t: Target) -> Check:
    """The prompt folder holds train.jsonl."""
    if t.data is None:
        return Check(name="data", status="skip", detail="not asked (--data)")
    if not (t.data / "train.jsonl").is_file():
        return Check(
            name="data",
            status="fail",
            detail=f"{t.data}/train.jsonl does not exist",
            fix=f"python scripts/prepare_hotpotqa.py --out {t.data} (or set DATA)",
        )
    return Check(name="data", status="ok", detail=f"{t.data.absolute()}")


def check_retriever(p: Probes, t: Target) -> Check:
    """The retriever is reachable by every node and answers `/health` with the expected index."""
    url = t.retriever
    if url is None:
        return Check(name="retriever", status="skip", detail="not asked (--retriever)")
    if "://" not in url:
        exists = Path(url).is_dir()
        return Check(
            name="retriever",
            status="ok" if exists else "fail",
            detail=f"index directory {url}" + ("" if exists else " does not exist"),
            fix="" if exists else "build it with `tracerl index build`, or pass a server URL",
        )
    if t.nodes > 1 and is_loopback_url(url):
        return Check(
            name="retriever",
            status="fail",
            detail=f"{url} is a loopback address, but the run has {t.nodes} nodes: the "
            "trainer's node may not be this one",
            fix="serve it with --host 0.0.0.0 and pass RETRIEVER=http://<this node's IP>:PORT",
        )
    try:
        health = p.health(url)
    except Exception as err:  # any failure to answer is this check's finding
        from retrieval.errors import RequestRejected

        if isinstance(err, RequestRejected):  # Search-R1's own servers have no /health
            return Check(
                name="retriever",
                status="warn",
                detail=f"{url} answers but has no /health: its index is not checked",
            )
        text = next((s for s in str(err).splitlines() if s.strip()), type(err).__name__)
        cause = re.search(r"\(last: (.*)\)\. ", text)  # the client's message names the cause
        reason = cause.group(1) if cause else text
        return Check(
            name="retriever",
            status="fail",
            detail=f"no answer from {url}/health ({reason[:200]})",
            fix="start it (`tracerl serve-retriever --index DIR --host 0.0.0.0 --port 8000`) "
            "or fix the URL",
        )
    found = health.get("index_id")
    if t.index_id is not None and found != t.index_id:
        return Check(
            name="retriever",
            status="fail",
            detail=f"{url} serves index {found!r}, the run expects {t.index_id!r}",
            fix="serve the expected index, or pass its id",
        )
    return Check(name="retriever", status="ok", detail=f"{url} serves index {found!r}")


TOOLCHAIN: tuple[Callable[[Probes, Target], Check], ...] = (
    check_python,
    check_gcc,
    check_ninja,
    check_driver,
    check_nvcc,
    check_gpus,
    check_disk,
)
"""The machine's checks, which need nothing installed beyond torch (`make install-gpu` runs
them before the long builds)."""
CHECKS: tuple[Callable[[Probes, Target], Check], ...] = (
    *TOOLCHAIN,
    check_shared_disk,
    check_lock,
    check_ray,
    check_model,
    check_data,
    check_retriever,
)


def run_checks(probes: Probes, target: Target) -> list[Check]:
    """Every check, in order (toolchain, GPUs, disk, Ray, then the run's layout)."""
    return [check(probes, target) for check in CHECKS]


def format_report(checks: Sequence[Check]) -> str:
    """One line per check and a last line that counts them."""
    counts = {s: sum(c.status == s for c in checks) for s in ("ok", "warn", "fail", "skip")}
    tail = ", ".join(f"{n} {s}" for s, n in counts.items())
    verdict = "FAIL" if counts["fail"] else "PASS"
    return "\n".join([*(c.line() for c in checks), f"doctor: {verdict} ({tail})"])


# --- several nodes -----------------------------------------------------------------------------


def node_report(target: Target) -> dict[str, Any]:
    """What one node answers to the launcher's preflight task: its name, Ray and checks."""
    checks = run_checks(Probes.local(), target)
    return {
        "node": platform.node(),
        "ray": _version("ray"),
        "checks": [dataclasses.asdict(c) for c in checks],
    }


def compare_nodes(driver_ray: str | None, reports: Sequence[Mapping[str, Any]]) -> list[Check]:
    """Checks over every node's `node_report`: equal Ray versions, and each node's failures.

    >>> a = {"node": "a", "ray": "2.55.0", "checks": []}
    >>> [c.status for c in compare_nodes("2.55.0", [a, {**a, "node": "b", "ray": "2.60.0"}])]
    ['fail']
    """
    out: list[Check] = []
    for report in reports:
        node = report["node"]
        if report["ray"] != driver_ray:
            out.append(
                Check(
                    name=f"{node}: ray",
                    status="fail",
                    detail=f"ray {report['ray']} on {node}, {driver_ray} on the driver",
                    fix="start `ray start` from the project's venv on every node (same path)",
                )
            )
        for raw in report["checks"]:
            check = Check(**raw)
            if check.status in ("fail", "warn"):
                out.append(dataclasses.replace(check, name=f"{node}: {check.name}"))
    return out


def is_loopback_url(url: str) -> bool:
    """Whether a URL's host is this machine only (`localhost`, 127.0.0.0/8, ::1).

    >>> is_loopback_url("http://127.0.0.1:8000"), is_loopback_url("http://10.0.0.5:8000")
    (True, False)
    """
    scheme_free = url.partition("+")[2] if "+" in url.split("://")[0] else url
    host = urlsplit(scheme_free).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _no_gpu(name: str, t: Target) -> Check:
    if t.require_gpu:
        return Check(
            name=name,
            status="fail",
            detail="no GPU: nvidia-smi is missing or fails",
            fix="run this on a GPU node with the NVIDIA driver installed",
        )
    return Check(name=name, status="skip", detail="no GPU")


def _major(text: str | None) -> int | None:
    found = re.match(r"\s*(\d+)", text or "")
    return int(found.group(1)) if found else None


if __name__ == "__main__":
    # `make install-gpu` runs this before trace-rl's own dependencies are in (no tyro, no rich):
    # the GPU node's checks, stdlib only; `tracerl doctor` is the command with options
    probes, target = Probes.local(), Target(require_gpu=True)
    found = [check(probes, target) for check in TOOLCHAIN]
    print(format_report(found))
    sys.exit(1 if any(c.status == "fail" for c in found) else 0)
