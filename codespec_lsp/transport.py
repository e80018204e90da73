"""Transports: stdio (the default), TCP and WebSocket; one connection, one session.

Promises:
- stdio: one session; the exit status is the session's (0 after shutdown + exit, 1 without).
- TCP and WebSocket listen where told, 127.0.0.1 unless `--host` says otherwise. One client
  at a time: while a session is open, a second connection gets a window/showMessage saying so
  and is closed; it never sees, nor changes, the first client's documents or answers. When a
  client leaves, its session ends (its engine work is cancelled and drained) and the next
  connection gets a fresh one (workspace, settings, scheduler) on the same loaded models.
- WebSocket: a browser page can open a socket to localhost, and browsers send its Origin. A
  handshake with an Origin header is refused (HTTP 403) unless that origin was allowed with
  `--allow-origin`; clients that send no Origin (editors, scripts) connect.

pygls's own `start_tcp`/`start_ws` shared one protocol (one workspace) between every
connection, and its stream loop could not resynchronise: both are replaced here, reusing
pygls's writers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
from typing import Any, Awaitable, BinaryIO, Callable, Protocol, Sequence

from pygls.io_ import StdoutWriter, WebSocketWriter

from codespec_lsp.lsp_protocol import MAX_MESSAGE_BYTES, HardenedProtocol, read_stream

log = logging.getLogger("codespec_lsp.transport")

BUSY = ("codespec-lsp: another client is connected to this server, which serves one session "
        "at a time; start a server of your own (stdio is the default)")


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


def _busy_message() -> bytes:
    return json.dumps({"jsonrpc": "2.0", "method": "window/showMessage",
                       "params": {"type": 1, "message": BUSY}}).encode()


class _OneAtATime:
    """The open session, if any; a session counts as open until its teardown is done."""

    def __init__(self, make_session: Callable[[], Session]) -> None:
        self.make_session = make_session
        self.active: Session | None = None

    async def run(self, session: Session, read: Callable[[], Awaitable[bytes]] | None,
                  messages: Any = None) -> None:
        self.active = session
        try:
            if read is not None:
                await read_stream(session.protocol, read)
            else:
                async for data in messages:
                    session.protocol.receive(data)
                    if session.protocol.ended:
                        break
        finally:
            try:
                await session.end_session()
            finally:
                self.active = None


def serve_tcp(make_session: Callable[[], Session], host: str, port: int) -> int:
    sessions = _OneAtATime(make_session)

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        if sessions.active is not None:
            log.warning("refused a second connection from %s: a session is open", peer)
            body = _busy_message()
            writer.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            await _close(writer)
            return
        log.info("client connected from %s", peer)
        session = sessions.make_session()
        session.protocol.set_writer(writer)  # type: ignore[arg-type]
        try:
            await sessions.run(session, lambda: reader.read(65536))
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

    sessions = _OneAtATime(make_session)

    async def on_connect(ws: Any) -> None:
        if sessions.active is not None:
            log.warning("refused a second WebSocket connection: a session is open")
            await ws.send(_busy_message().decode())
            await ws.close(1013, "busy: one session at a time")
            return
        session = sessions.make_session()
        session.protocol.set_writer(WebSocketWriter(ws), include_headers=False)

        async def messages():
            try:
                while True:
                    yield await ws.recv()
            except ConnectionClosed:
                return

        try:
            await sessions.run(session, None, messages())
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
