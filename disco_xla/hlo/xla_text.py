"""HLO text <-> HloModuleProto through XLA's own parser and printer, isolated.

XLA's C++ text parser aborts the whole process (a CHECK failure) on some malformed
modules, for example a reshape whose element counts differ. So we never call it in
the user's process: a small worker process does the parsing and printing, and if it
dies we report the reason it gave as an ordinary input error and start a new one.
Every reply has a deadline, so a parser that never returns cannot hang us either.

Run as `python -m disco_xla.hlo.xla_text` it is that worker.
"""

from __future__ import annotations

import atexit
import os
import select
import struct
import subprocess
import sys
import tempfile
import time

from disco_xla.errors import DiscoInputError

_TEXT_TO_PROTO = b"T"
_PROTO_TO_TEXT = b"P"
_HEADER = struct.Struct("<cQ")  # request: op, payload length
_REPLY = struct.Struct("<BQ")  # reply: status (0 ok, 1 error), payload length
_BASE_TIMEOUT_S = 60.0
_TIMEOUT_S_PER_MB = 5.0


class _WorkerDied(Exception):
    pass


class _TextWorker:
    """One worker process; replaced after it dies or times out."""

    def __init__(self) -> None:
        self._stderr = tempfile.TemporaryFile()
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        env.setdefault("JAX_PLATFORMS", "cpu")
        env["TF_CPP_MIN_LOG_LEVEL"] = "3"
        self._process = subprocess.Popen(
            [sys.executable, "-m", "disco_xla.hlo.xla_text"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
        )

    def alive(self) -> bool:
        return self._process.poll() is None

    def request(self, op: bytes, payload: bytes, timeout_s: float) -> tuple[int, bytes]:
        deadline = time.monotonic() + timeout_s
        try:
            self._process.stdin.write(_HEADER.pack(op, len(payload)) + payload)
            self._process.stdin.flush()
        except (BrokenPipeError, OSError):
            raise _WorkerDied(self._death_reason()) from None
        status, length = _REPLY.unpack(self._read(_REPLY.size, deadline))
        return status, self._read(length, deadline)

    def _read(self, count: int, deadline: float) -> bytes:
        fd = self._process.stdout.fileno()
        chunks, remaining = [], count
        while remaining:
            wait_s = deadline - time.monotonic()
            if wait_s <= 0 or not select.select([fd], [], [], wait_s)[0]:
                self.close()
                raise _WorkerDied("XLA's text parser did not answer in time") from None
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                self._process.wait()
                raise _WorkerDied(self._death_reason())
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def _death_reason(self) -> str:
        self._stderr.seek(0)
        lines = self._stderr.read().decode(errors="replace").splitlines()
        for line in lines:
            if "Check failed" in line:
                return "XLA aborted: " + line.split("] ", 1)[-1]
        for line in reversed(lines):
            if line.strip():
                return "XLA aborted: " + line.strip()[:300]
        return f"XLA's parser process exited with code {self._process.returncode}"

    def close(self) -> None:
        if self.alive():
            self._process.kill()
        self._process.wait()
        self._stderr.close()


_worker: _TextWorker | None = None


def _call(op: bytes, payload: bytes, source: str, what: str) -> bytes:
    global _worker
    if _worker is None or not _worker.alive():
        _worker = _TextWorker()
    timeout_s = _BASE_TIMEOUT_S + _TIMEOUT_S_PER_MB * len(payload) / 1e6
    try:
        status, reply = _worker.request(op, payload, timeout_s)
    except _WorkerDied as died:
        _worker = None
        raise DiscoInputError(source, f"{what}: {died}") from None
    if status != 0:
        raise DiscoInputError(
            source, f"{what}: {_summarize_xla_error(reply.decode(errors='replace'))}"
        )
    return reply


def _summarize_xla_error(message: str) -> str:
    """XLA's parse errors span several lines; keep the status and the location."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    located = [line for line in lines if "error:" in line]
    head = lines[0] if lines else "unknown error"
    head = head.split(": ", 1)[-1] if head.startswith(("INVALID_ARGUMENT", "INTERNAL")) else head
    if located and located[0] not in head:
        return f"{head} ({located[0]})"
    return head


def text_to_proto_bytes(text: str, source: str) -> bytes:
    """Parse HLO text with XLA's parser; returns serialized HloModuleProto bytes."""
    return _call(_TEXT_TO_PROTO, text.encode(), source, "HLO text does not parse")


def proto_bytes_to_text(data: bytes, source: str) -> str:
    """Print a serialized module as parsable HLO text, metadata and large constants
    included, so that parsing it back loses nothing we use."""
    return _call(_PROTO_TO_TEXT, data, source, "cannot print the module as HLO text").decode()


@atexit.register
def _close_worker() -> None:
    if _worker is not None:
        _worker.close()


def _serve() -> None:
    """The worker: answer requests on stdin until it closes."""
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints must not corrupt the reply stream
    requests = sys.stdin.buffer
    # Only the worker loads XLA: the IR (and `import disco_xla`) stays free of jax.
    from jax._src.lib import xla_client

    hlo = xla_client.hlo
    while True:
        header = requests.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return
        op, length = _HEADER.unpack(header)
        payload = requests.read(length)
        try:
            if op == _TEXT_TO_PROTO:
                result = hlo.hlo_module_from_text(payload.decode()).as_serialized_hlo_module_proto()
            else:
                options = hlo.HloPrintOptions.short_parsable()
                options.print_metadata = True
                options.print_large_constants = True
                module = hlo.XlaComputation(payload).get_hlo_module()
                result = module.to_string(options).encode()
            status = 0
        except Exception as error:  # noqa: BLE001 - every failure becomes a reply
            status, result = 1, str(error).encode()
        replies.write(_REPLY.pack(status, len(result)) + result)
        replies.flush()


if __name__ == "__main__":
    _serve()
