"""The course's lock: pyproject.toml says what the course needs (loose), requirements.lock what it was tested with.

Why uv: `uv pip compile --universal` resolves once for every platform and Python the course supports and writes
one pip-readable file with environment markers (torch's CUDA libraries only on Linux, numpy 2.2 on Python 3.10,
...) and every wheel's sha256; pip-tools resolves for the machine it runs on only, so a lock made on Linux would
not install on a Mac. Learners never need uv: pip installs the lock (`make setup`); only whoever re-locks does.

    python tools/lock.py                    # re-lock after pyproject.toml changed; keeps every pin that still fits,
                                            # then checks each pin has a wheel for Linux x86_64/aarch64, macOS arm64
    python tools/lock.py --upgrade --out F  # the newest releases into F (make latest / make upgrade)
    python tools/lock.py --check            # offline: the lock satisfies pyproject.toml, binder/ derived from it
    python tools/lock.py --diff OLD NEW     # which packages moved between two locks

It also writes binder/requirements.txt, the lock for Binder and the site's build: the same pins but torch and
torchvision's CPU builds from PyTorch's own index (about 5 GB less than the CUDA build, and nothing of CUDA),
without hashes, since the universal lock knows PyPI's wheels only.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# course_lib.versions by its path: importing the package would import torch, which make latest's bare venv lacks
_spec = importlib.util.spec_from_file_location("course_lib_versions", ROOT / "course_lib" / "versions.py")
versions = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(versions)
LOCK_NAME, locked, normalise = versions.LOCK_NAME, versions.locked, versions.normalise

LOCK = ROOT / LOCK_NAME
BINDER = ROOT / "binder" / "requirements.txt"
OLDEST_PYTHON = "3.10"          # pyproject's requires-python; the lock forks per Python where it must
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
CUDA_ONLY = re.compile(r"^(nvidia-|cuda-|triton$)")   # torch's CUDA build pulls these in; its CPU build does not
CPU_BUILD = ("torch", "torchvision")
# Where a learner installs the lock: uv's platform names, and the oldest macOS that torch's wheels support.
PLATFORMS = {"Linux x86_64": "x86_64-manylinux_2_28", "Linux aarch64": "aarch64-manylinux_2_28",
             "macOS 14+ arm64": "aarch64-apple-darwin"}
PYTHONS = (OLDEST_PYTHON, "3.13")


def uv() -> list[str]:
    try:
        import uv as uv_module   # pip install uv: the binary ships inside the wheel
        return [uv_module.find_uv_bin()]
    except ImportError:
        sys.exit("tools/lock.py needs uv: pip install uv  (make lock does this)")


def compile_lock(out: Path, upgrade: bool = False) -> None:
    """Resolve pyproject.toml with every extra into `out`; without `upgrade`, `out`'s existing pins are kept."""
    cmd = [*uv(), "pip", "compile", str(ROOT / "pyproject.toml"), "--all-extras", "--universal",
           "--generate-hashes", "--python-version", OLDEST_PYTHON, "--custom-compile-command", "make lock",
           "-o", str(out), "--quiet"]
    if upgrade:
        cmd.append("--upgrade")
    subprocess.run(cmd, cwd=ROOT, check=True)


def wheels_missing(lock: Path) -> list[str]:
    """Each platform and Python (oldest, newest) where some pin of `lock` has no wheel (uv, online)."""
    missing = []
    for name, platform in PLATFORMS.items():
        for python in PYTHONS:
            done = subprocess.run([*uv(), "pip", "compile", str(lock), "--python-platform", platform,
                                   "--python-version", python, "--only-binary", ":all:", "--no-deps", "--quiet",
                                   "--no-header", "-o", os.devnull], cwd=ROOT, capture_output=True, text=True,
                                  env={**os.environ, "MACOSX_DEPLOYMENT_TARGET": "14.0"})
            if done.returncode:
                missing.append(f"{name}, Python {python}: {(done.stderr.strip().splitlines() or ['uv failed'])[-1]}")
    return missing


def binder_requirements(lock: Path) -> str:
    """The lock's pins without hashes, torch and torchvision as CPU builds, no CUDA libraries (Linux x86_64)."""
    lines = ["# Made from requirements.lock by tools/lock.py (make lock): do not edit.",
             "# Binder and the site's build: the tested versions, with torch's CPU build from PyTorch's index.",
             f"--extra-index-url {CPU_INDEX}"]
    for pin in locked(lock):
        if CUDA_ONLY.match(pin.name):
            continue
        version = f"{pin.version}+cpu" if pin.name in CPU_BUILD else pin.version
        lines.append(f"{pin.name}=={version}" + (f" ; {pin.marker}" if pin.marker else ""))
    return "\n".join(lines) + "\n"


def pyproject_requirements() -> list[str]:
    """Every requirement pyproject.toml names (dependencies and all extras), but the course's own."""
    try:
        import tomllib
    except ModuleNotFoundError:   # Python 3.10
        import tomli as tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    return [r for r in reqs if not normalise(r).startswith(normalise(project["name"]))]


def check(lock: Path = LOCK) -> list[str]:
    """What is wrong with the lock, offline: a requirement unpinned or pinned outside its range; binder stale."""
    from packaging.requirements import Requirement

    problems = []
    pins: dict[str, list[str]] = {}
    for pin in locked(lock):
        pins.setdefault(pin.name, []).append(pin.version)
    for text in pyproject_requirements():
        req = Requirement(text)
        versions = pins.get(normalise(req.name))
        if not versions:
            problems.append(f"{req.name} is in pyproject.toml but not pinned in {lock.name}: run `make lock`")
        for v in versions or ():
            if not req.specifier.contains(v, prereleases=True):
                problems.append(f"{lock.name} pins {req.name}=={v}, outside pyproject.toml's {text!r}: run `make lock`")
    if lock == LOCK and (not BINDER.is_file() or BINDER.read_text() != binder_requirements(lock)):
        problems.append(f"{BINDER.relative_to(ROOT)} is not what {lock.name} makes: run `python tools/lock.py`")
    return problems


def moved(old: Path, new: Path) -> list[tuple[str, str, str]]:
    """(package, old versions, new versions) for every package whose pins differ between two locks."""
    def table(path):
        out: dict[str, set[str]] = {}
        for pin in locked(path):
            out.setdefault(pin.name, set()).add(pin.version)
        return out
    a, b = table(old), table(new)
    return [(name, ", ".join(sorted(a.get(name, ()))) or "-", ", ".join(sorted(b.get(name, ()))) or "-")
            for name in sorted(set(a) | set(b)) if a.get(name) != b.get(name)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/lock.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--upgrade", action="store_true", help="resolve to the newest releases")
    parser.add_argument("--out", type=Path, default=LOCK, help=f"where to write the lock (default {LOCK_NAME})")
    parser.add_argument("--check", action="store_true", help="check the lock against pyproject.toml, offline")
    parser.add_argument("--diff", nargs=2, type=Path, metavar=("OLD", "NEW"), help="packages that moved")
    args = parser.parse_args(argv)
    if args.diff:
        for name, old, new in moved(*args.diff):
            print(f"{name:32} {old:>16} -> {new}")
        return 0
    if args.check:
        problems = check(args.out)
        print("\n".join(problems) or f"{args.out.name} satisfies pyproject.toml; binder/ is derived from it")
        return 1 if problems else 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    compile_lock(args.out, upgrade=args.upgrade)
    missing = wheels_missing(args.out)
    for line in missing:
        print(f"no wheel for every pin on {line}", file=sys.stderr)
    if args.out == LOCK:
        BINDER.write_text(binder_requirements(LOCK))
    print(f"wrote {args.out}" + (f" and {BINDER.relative_to(ROOT)}" if args.out == LOCK else "")
          + f"; every pin has a wheel for {', '.join(PLATFORMS)} on Python {' and '.join(PYTHONS)}" * (not missing))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
