"""The lab's one way to run something in a fresh Python process, so that nothing of another
run's libraries, thread pools, caches or global settings reaches it, and its wall time
and peak memory are its own.

A :class:`Worker` serves one request at a time over JSON lines: :meth:`~Worker.call` a
function, or :meth:`~Worker.open` a session whose methods :meth:`~Worker.ask` calls.
A function is named ``"module:name"`` or ``"file.py:name"`` (the file loaded alone: this
module runs there as a file, so such a process imports nothing of pyw8a8)."""
import importlib
import importlib.util
import json
import os
import select
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

#: First on the process's import path: it imports this very tree.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_START = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')"


class WorkerError(RuntimeError):
    """A call failed in its process (its traceback), or the process ended or fell silent."""


def function(name):
    """The function that `name` (``"module:name"`` or ``"file.py:name"``) names."""
    where, _, attribute = name.rpartition(":")
    if where.endswith(".py"):
        spec = importlib.util.spec_from_file_location(Path(where).stem, where)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    return getattr(module, attribute)


class Worker:
    """A fresh Python process serving one request at a time, with `env` on top of this
    process's environment, ended past `timeout` seconds a request (WorkerError), its stderr
    kept for the failure's message where `capture_stderr`."""

    def __init__(self, env=None, timeout=None, capture_stderr=False):
        env = {**os.environ, **(env or {})}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT,
                                                          env.get("PYTHONPATH")]))
        self.timeout = timeout
        self._stderr = tempfile.TemporaryFile(mode="w+") if capture_stderr else None
        self._process = subprocess.Popen([sys.executable, "-c", _START, __file__], env=env,
                                         text=True, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self._stderr)

    def call(self, name, *args):
        """The result of the function `name` called with `args` there (JSON values)."""
        return self._request("call", name, args)

    def open(self, name, *args):
        """Call the function `name` there and keep what it returns as the session."""
        self._request("open", name, args)
        return self

    def ask(self, method, *args):
        """The result of the session's `method` called with `args`."""
        return self._request("ask", method, args)

    def _request(self, op, name, args):
        try:
            self._process.stdin.write(json.dumps([op, name, list(args)]) + "\n")
            self._process.stdin.flush()
            ready, _, _ = select.select([self._process.stdout], [], [], self.timeout)
            line = self._process.stdout.readline() if ready else ""
        except (OSError, ValueError):  # the process has ended, or was closed
            ready, line = True, ""
        if not line:
            raise WorkerError(self._end(None if ready else f"no reply in {self.timeout:.0f} s"))
        status, value = json.loads(line)
        if status == "error":
            raise WorkerError(value)
        return value

    def _end(self, why):
        """End the process; why it failed: `why`, else its stderr's last lines."""
        self._process.kill()
        self._process.wait()
        if why is None and self._stderr is not None:
            self._stderr.seek(0)
            why = self._stderr.read().strip()[-3000:]
        self.close()
        return why or f"the process ended with status {self._process.returncode}"

    def close(self):
        """End the process (its loop stops at the end of its input)."""
        if self._process.poll() is None:
            self._process.stdin.close()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        for stream in (self._process.stdin, self._process.stdout, self._stderr):
            if stream is not None:
                stream.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def run_once(name, *args, **options):
    """The result of the function `name` called with `args` in a fresh process that then
    ends; `options` as :class:`Worker`'s."""
    with Worker(**options) as worker:
        return worker.call(name, *args)


def serve():
    """The process's side: each reply one JSON line on the real stdout; prints go to stderr."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    session = None
    for line in sys.stdin:
        op, name, args = json.loads(line)
        try:
            value = (getattr(session, name) if op == "ask" else function(name))(*args)
            if op == "open":
                session, value = value, None
            reply = ["ok", value]
        except Exception:  # the parent raises it
            reply = ["error", traceback.format_exc()]
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    serve()
