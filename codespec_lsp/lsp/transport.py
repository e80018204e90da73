"""Transports: stdio (the default), TCP and WebSocket; one connection, one session.

Promises:
- stdio: one session; the exit status is the session's (0 after shutdown + exit, 1 without).
- TCP and WebSocket listen where told, 127.0.0.1 unless `--host` says otherwise. Each
  connection gets a session of its own (workspace, settings, scheduler, answers): a client
  never sees, nor changes, another client's documents or answers. The sessions share the loaded
  models and take turns on the engine's one thread (`SharedWorker`). When a client leaves, its
  session ends (its engine work is cancelled).
- WebSocket: a browser page can open a socket to localhost, and browsers send its Origin. A
  handshake with an Origin header is refused (HTTP 403) unless that origin was allowed with
  `--allow-origin`; clients that send no Origin (editors, scripts) connect.

pygls's own `start_tcp`/`start_ws` shared one protocol (one workspace) between every
connection, and its stream loop could not resynchronise: both are replaced here, reusing
pygls's writers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import sys
import threading
from typing import Any, Awaitable, BinaryIO, Callable, Protocol, Sequence

from pygls.io_ import StdoutWriter, WebSocketWriter

from codespec_lsp.lsp.protocol import MAX_MESSAGE_BYTES, HardenedProtocol, read_stream

log = logging.getLogger("codespec_lsp.lsp.transport")

class Session(Protocol):
    protocol: HardenedProtocol

    async def end_session(self) -> None: ...


def _stdin_reader(stream: BinaryIO) -> Callable[[], Awaitable[bytes]]:
    """Chunks of `stream` read by a daemon thread (a blocked read never holds up the exit)."""
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[bytes] = asyncio.Queue()
    try:
        # os.read on the descriptor: a daemon thread blocked in a BufferedReader holds its lock,
        # and the interpreter aborts at exit ("could not acquire lock for <stdin>").
        fd = stream.fileno()
        read = lambda n: os.read(fd, n)  # noqa: E731
    except (AttributeError, OSError, ValueError):  # a stream without a descriptor (tests)
        read = getattr(stream, "read1", stream.read)

    def pump() -> None:
        while True:
            try:
                chunk = read(65536)
            except (OSError, ValueError):
                chunk = b""
            try:
                loop.call_soon_threadsafe(chunks.put_nowait, chunk)
            except RuntimeError:  # the loop is closed: the session is over
                return
            if not chunk:
                return

    threading.Thread(target=pump, name="codespec-stdin", daemon=True).start()
    return chunks.get


def _exit_code(protocol: HardenedProtocol) -> int:
    if protocol.exit_code is not None:
        return protocol.exit_code
    return 0 if protocol._shutdown else 1  # the client went away without `exit`


def serve_stdio(session: Session, stdin: BinaryIO | None = None,
                stdout: BinaryIO | None = None) -> int:
    session.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))

    async def main() -> None:
        try:
            await read_stream(session.protocol, _stdin_reader(stdin or sys.stdin.buffer))
        finally:
            await session.end_session()

    try:
        asyncio.run(main())
    except BrokenPipeError:
        log.error("the client closed the connection")
    return _exit_code(session.protocol)


class SharedWorker(concurrent.futures.Executor):
    """One engine thread for every session of a server; a session's end does not stop it."""

    def __init__(self, name: str) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(1, name)

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
        return self._pool.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """A session ending: its jobs were cancelled by their tokens; the thread stays."""


async def _run(session: Session, read: Callable[[], Awaitable[bytes]] | None,
               messages: Any = None) -> None:
    try:
        if read is not None:
            await read_stream(session.protocol, read)
        else:
            async for data in messages:
                session.protocol.receive(data)
                if session.protocol.ended:
                    break
    finally:
        await session.end_session()


def serve_tcp(make_session: Callable[[], Session], host: str, port: int) -> int:
    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        log.info("client connected from %s", peer)
        session = make_session()
        session.protocol.set_writer(writer)  # type: ignore[arg-type]
        try:
            await _run(session, lambda: reader.read(65536))
        finally:
            await _close(writer)
            log.info("client %s left", peer)

    async def main() -> None:
        server = await asyncio.start_server(on_connect, host, port)
        for sock in server.sockets:
            log.info("codespec-lsp: listening on %s:%s (TCP)", *sock.getsockname()[:2])
        async with server:
            await server.serve_forever()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    return 0


async def _close(writer: asyncio.StreamWriter) -> None:
    try:
        writer.close()
        await writer.wait_closed()
    except (ConnectionError, OSError):
        pass


def serve_ws(make_session: Callable[[], Session], host: str, port: int,
             allow_origins: Sequence[str] = ()) -> int:
    from websockets.asyncio.server import serve
    from websockets.exceptions import ConnectionClosed

    async def on_connect(ws: Any) -> None:
        session = make_session()
        session.protocol.set_writer(WebSocketWriter(ws), include_headers=False)

        async def messages():
            try:
                while True:
                    yield await ws.recv()
            except ConnectionClosed:
                return

        try:
            await _run(session, None, messages())
        finally:
            await ws.close()

    async def main() -> None:
        # `origins`: websockets answers 403 to any other Origin; None admits clients that send
        # none (editors do not; browsers always do).
        async with serve(on_connect, host, port, origins=[None, *allow_origins],
                         max_size=MAX_MESSAGE_BYTES) as server:
            for sock in server.sockets:
                log.info("codespec-lsp: listening on %s:%s (WebSocket)",
                         *sock.getsockname()[:2])
            await server.serve_forever()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    return 0
