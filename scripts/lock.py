"""Write and compare the committed lock files (`make lock`, `make test-latest`).

    python scripts/lock.py write --python VENV/bin/python --out requirements/cpu.lock
    python scripts/lock.py diff --python VENV/bin/python --lock requirements/cpu.lock
    python scripts/lock.py pin uv==0.13.9 --out requirements/uv.lock

`write` freezes the packages installed in a venv built by the unpinned recipe (`make
resolve-latest`) and pins each with the sha256 of every file PyPI holds for that version (so the
lock installs on any platform PyPI has a wheel for), or of the local wheel for a local version
such as torch's `+cpu` build. `diff` prints what moved between a venv and a lock, one line a
package, and exits 0: moving is what `make test-latest` reports, not a failure.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import subprocess
import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from harness.training.lock_file import read_lock  # noqa: E402

INDEX = "https://pypi.org/simple/{name}/"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
# where a local version (torch's `+cpu`) lies: this machine's wheel folder, else PyTorch's own page
LOCAL_WHEELS = (Path("/opt/wheels"), "https://download.pytorch.org/whl/{name}/")
# the installer itself and the project: never pinned in the lock (`make install` brings uv first)
UNLOCKED = {"pip", "uv", "trace-rl"}
_FREEZE = (
    "import importlib.metadata as m, json; print(json.dumps(sorted("
    "(d.metadata['Name'], d.version) for d in m.distributions() if d.metadata['Name'])))"
)


def frozen(python: str) -> dict[str, str]:
    """The distributions installed for `python`, by canonical name, less `UNLOCKED`."""
    out = subprocess.run([python, "-c", _FREEZE], capture_output=True, text=True, check=True)
    pins = {canonicalize_name(name): version for name, version in json.loads(out.stdout)}
    return {name: v for name, v in sorted(pins.items()) if name not in UNLOCKED}


def _file_version(filename: str) -> Version | None:
    try:
        return parse_wheel_filename(filename)[1]
    except InvalidWheelFilename:
        pass
    try:
        return parse_sdist_filename(filename)[1]
    except InvalidSdistFilename:
        return None


def _local_hashes(name: str, version: str, client: httpx.Client) -> list[str]:
    folder, page = LOCAL_WHEELS
    hashes = [
        hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.glob(f"{name.replace('-', '_')}-*.whl"))
        if _file_version(path.name) == Version(version)
    ]
    if hashes:
        return hashes
    reply = client.get(page.format(name=name), follow_redirects=True)
    reply.raise_for_status()
    links = [link for link in reply.text.split("href=")[1:] if "#sha256=" in link]
    return [
        link.split("#sha256=")[1].split('"')[0]
        for link in links
        if _file_version(link.split("#")[0].rsplit("/", 1)[-1]) == Version(version)
    ]


def hashes_of(name: str, version: str, client: httpx.Client) -> list[str]:
    """The sha256 of every file of `name==version`: PyPI's, or the local wheels' for `+local`."""
    if "+" in version:
        found = _local_hashes(name, version, client)
    else:
        reply = client.get(INDEX.format(name=name), headers={"Accept": SIMPLE_JSON})
        reply.raise_for_status()
        found = [
            f["hashes"]["sha256"]
            for f in reply.json()["files"]
            if _file_version(f["filename"]) == Version(version) and "sha256" in f["hashes"]
        ]
    if not found:
        raise SystemExit(f"no file of {name}=={version} found to hash")
    return sorted(set(found))


def write_lock(pins: Mapping[str, str], out: Path, header: str) -> None:
    """Write `pins` with their hashes to `out` as a pip requirements file."""
    with httpx.Client(timeout=60) as client, ThreadPoolExecutor(8) as pool:
        hashes = list(pool.map(lambda item: hashes_of(*item, client), pins.items()))
    lines = [header]
    for (name, version), digests in zip(pins.items(), hashes, strict=True):
        lines.append(f"{name}=={version} \\")
        lines.extend(f"    --hash=sha256:{d} \\" for d in digests[:-1])
        lines.append(f"    --hash=sha256:{digests[-1]}")
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")


def canonical_pin(text: str) -> tuple[str, str]:
    """`Name==1.0` as (`name`, `1.0`)."""
    name, _, version = text.partition("==")
    if not version:
        raise SystemExit(f"{text!r} is not NAME==VERSION")
    return canonicalize_name(name), version


def moved(lock: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """One line a package that differs between `lock` and `now`: moved, added or gone."""
    lines = []
    for name in sorted(set(lock) | set(now)):
        old, new = lock.get(name), now.get(name)
        if old != new:
            lines.append(f"{name}: {old or '(not locked)'} -> {new or '(not installed)'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """The command line: `write` a lock from a venv, or `diff` a venv against a lock."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    write = sub.add_parser("write", help="freeze a venv into a hashed lock file")
    write.add_argument("--python", required=True, help="the venv's interpreter")
    write.add_argument("--out", type=Path, required=True)
    write.add_argument("--what", default="the CPU venv of `make install`")
    pin = sub.add_parser("pin", help="write a lock of given pins (the installer's own)")
    pin.add_argument("pins", nargs="+", metavar="NAME==VERSION")
    pin.add_argument("--out", type=Path, required=True)
    diff = sub.add_parser("diff", help="print what moved between a venv and a lock")
    diff.add_argument("--python", required=True)
    diff.add_argument("--lock", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "pin":
        pins = dict(canonical_pin(text) for text in args.pins)
        header = "# The installer `make install` brings first; `make lock` rewrites it."
        write_lock(pins, args.out, header)
        return 0
    now = frozen(args.python)
    if args.command == "diff":
        lines = moved(read_lock(args.lock), now)
        print(f"{len(lines)} packages moved against {args.lock}:")
        print("\n".join(f"  {line}" for line in lines))
        return 0
    probe = "import platform; print(platform.python_version(), platform.machine())"
    python = subprocess.run(
        [args.python, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    header = (
        f"# The exact package set of {args.what}, with the hashes of every file of each version.\n"
        f"# Resolved by `make lock` on {datetime.date.today()} with CPython {python[0]} on Linux "
        f"{python[1]}; do not edit.\n"
        "# pyproject.toml keeps the library's ranges; tests/test_lock.py keeps the two in step."
    )
    write_lock(now, args.out, header)
    print(f"wrote {args.out}: {len(now)} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
