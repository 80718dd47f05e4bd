"""A shard server on this machine: a folder served over real HTTP, in its own process.

Training sets that are too big, or change too often, for every machine's disk live in an object
store (S3, GCS, a web server) as shard files, and trainers stream them over HTTP. `ShardServer`
stands in for that store: Python's `http.server` in a child process bound to 127.0.0.1 on a free
port, optionally adding a fixed latency to every request (a network round trip), stopped by
`close()` or at the end of a `with` block, and killed when the interpreter exits in any case.

    with ShardServer(folder, latency_ms=20) as server:
        urls = server.urls(paths)          # ["http://127.0.0.1:PORT/shard-00000.tar", ...]

    python course_lib/shard_server.py FOLDER [--latency-ms 20]   # what the child process runs

Standard library only, and started as a script, so the child starts in a fraction of a second
(no torch import).
"""
from __future__ import annotations

import argparse
import atexit
import functools
import subprocess
import sys
import tempfile
import time
import weakref
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

START_TIMEOUT_S = 20


class _Handler(SimpleHTTPRequestHandler):
    latency_s = 0.0

    def do_GET(self):
        time.sleep(self.latency_s)              # the round trip of a real network, before any byte
        super().do_GET()

    def log_message(self, format, *args):   # one line per request would flood a notebook
        pass


def serve(directory, latency_ms: float = 0.0, port: int = 0) -> None:
    """Serve `directory` on 127.0.0.1:`port` (0: a free one) until killed; print the port first."""
    handler = type("Handler", (_Handler,), {"latency_s": latency_ms / 1000})
    server = ThreadingHTTPServer(("127.0.0.1", port), functools.partial(handler, directory=str(directory)))
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


class ShardServer:
    """Serve `directory` over HTTP from a child process on 127.0.0.1; a context manager."""

    def __init__(self, directory, latency_ms: float = 0.0):
        directory = Path(directory)
        if not directory.is_dir():
            raise NotADirectoryError(f"directory must be an existing folder to serve; got {str(directory)!r}")
        if isinstance(latency_ms, bool) or not isinstance(latency_ms, (int, float)) or not 0 <= latency_ms <= 10_000:
            raise ValueError(f"latency_ms must be a number of milliseconds in [0, 10000]; got {latency_ms!r}")
        self.directory, self.latency_ms = directory, latency_ms
        self._errors = tempfile.TemporaryFile(mode="w+")   # a file, not a pipe: a full pipe would stall the server
        self._proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), str(directory), "--latency-ms", str(latency_ms)],
            stdout=subprocess.PIPE, stderr=self._errors, text=True)
        # a kernel that is interrupted or restarted must not leave a server behind
        self._finalizer = weakref.finalize(self, _stop, self._proc, self._errors)
        atexit.register(self._finalizer)
        line = _read_line(self._proc, START_TIMEOUT_S)
        if not line.strip().isdigit():
            self._errors.seek(0)
            why = self._errors.read()[-500:].strip() or f"no port printed within {START_TIMEOUT_S} s"
            self.close()
            raise RuntimeError(f"the shard server for {str(directory)!r} did not start: {why}")
        self.port = int(line)
        self.base_url = f"http://127.0.0.1:{self.port}/"

    def url(self, name) -> str:
        """The URL of file `name` (a path relative to the served folder, or a file inside it)."""
        path, root = Path(name), self.directory.resolve()
        if path.resolve().is_relative_to(root):
            path = path.resolve().relative_to(root)
        elif path.is_absolute():
            raise ValueError(f"name must be a file inside the served folder {str(root)!r}; got {str(name)!r}")
        return self.base_url + quote(path.as_posix())

    def urls(self, paths) -> list[str]:
        return [self.url(p) for p in paths]

    @property
    def running(self) -> bool:
        return self._proc.poll() is None

    def close(self) -> None:
        """Stop the server process (safe to call twice)."""
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = f"{self.base_url}" if self.running else "stopped"
        return f"ShardServer({str(self.directory)!r}, latency_ms={self.latency_ms}, {state})"


def _read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    """The child's first stdout line, or '' if it exits or says nothing for `timeout_s`."""
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout_s):
            return ""
    return proc.stdout.readline()


def _stop(proc: subprocess.Popen, errors) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    proc.stdout.close()
    errors.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Serve a folder of shards on 127.0.0.1 (a free port).")
    parser.add_argument("directory")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="added to every request")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    serve(args.directory, args.latency_ms, args.port)
