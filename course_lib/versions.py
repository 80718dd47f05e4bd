"""Which versions the course was tested with (requirements.lock), and which ones this machine has.

A release of torch, Lightning or JupyterLab in week 6 of a semester can change what a lecture prints or
break it; the lock pins what the course's own suite passed with. `python -m course_lib doctor` reports
each package whose installed version differs from the lock:

    python -m course_lib doctor        # "versions: 2 packages differ from requirements.lock ..."

The lock is pip's requirements format with environment markers (one file for Linux, macOS and every
supported Python); `locked()` reads it, `differences()` keeps the lines whose markers match this machine.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

LOCK_NAME = "requirements.lock"
ENV_VAR = "COURSE_LOCK"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\#]+?))?\s*(?:\\|#|$)")


@dataclass(frozen=True)
class Pin:
    name: str          # normalised (PEP 503): lower case, runs of -_. as one -
    version: str
    marker: str = ""   # e.g. "python_full_version >= '3.11'"; empty: every environment


@dataclass(frozen=True)
class Difference:
    name: str
    locked: str
    installed: str | None   # None: not installed


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_path() -> Path | None:
    """$COURSE_LOCK, else requirements.lock in the checkout this package runs from; None for a wheel install."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    beside = Path(__file__).resolve().parent.parent / LOCK_NAME
    return beside if beside.is_file() else None


def locked(path: Path | str) -> list[Pin]:
    """Every `name==version ; marker` line of a lock (hash and comment lines skipped)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"lock file {str(path)!r} does not exist (set {ENV_VAR} or run `make lock`)")
    pins = []
    for line in path.read_text().splitlines():
        found = _PIN.match(line)
        if found:
            pins.append(Pin(normalise(found.group(1)), found.group(2), (found.group(3) or "").strip()))
    if not pins:
        raise ValueError(f"{path} holds no pinned requirement (name==version): not a lock file")
    return pins


def applies(pin: Pin, environment: dict | None = None) -> bool:
    """Whether `pin`'s marker holds here (or in `environment`, packaging's marker variables)."""
    if not pin.marker:
        return True
    from packaging.markers import Marker

    return Marker(pin.marker).evaluate(environment)


def installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def differences(path: Path | str, environment: dict | None = None) -> list[Difference]:
    """The lock's pins for this environment whose installed version differs (or that are missing)."""
    return differences_from(locked(path), environment)


def differences_from(pins: list[Pin], environment: dict | None = None) -> list[Difference]:
    """`differences` for pins already read. A local version label such as torch's `+cpu` or `+cu130` is the
    same release built for another device, so `2.14.1+cpu` matches a pin of `2.14.1`."""
    found = []
    for pin in pins:
        if not applies(pin, environment):
            continue
        have = installed_version(pin.name)
        if have is None or have.split("+")[0] != pin.version:
            found.append(Difference(pin.name, pin.version, have))
    return found


def report(out) -> None:
    """doctor's lines on versions: what differs from the lock, and what that means. Never fails."""
    path = lock_path()
    if path is None:
        print(f"{'versions':>15}: no {LOCK_NAME} beside this installation (a wheel or a git install, e.g. on "
              "Colab): the versions the course was tested with are in the release's requirements.lock", file=out)
        return
    try:
        diff = differences(path)
    except (OSError, ValueError, ImportError) as exc:
        print(f"{'versions':>15}: cannot compare with {path}: {exc}", file=out)
        return
    if not diff:
        print(f"{'versions':>15}: every package is the version requirements.lock pins (what the course was "
              "tested with)", file=out)
        return
    print(f"{'versions':>15}: {len(diff)} package(s) differ from {path.name}, which pins what the course's own "
          "tests passed with:", file=out)
    for d in diff[:12]:
        print(f"{'':>17}{d.name}: locked {d.locked}, installed {d.installed or 'none'}", file=out)
    if len(diff) > 12:
        print(f"{'':>17}... and {len(diff) - 12} more", file=out)
    print(f"{'':>17}The course may still run, but a lecture can print other figures or meet an API change. "
          "`pip install -r requirements.lock` in the course's venv installs the tested set.", file=out)
