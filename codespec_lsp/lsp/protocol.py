"""A hardened pygls protocol: framing, parsing and lifecycle that survive bad input.

pygls (2.1) does the dispatching, the LSP types and the workspace; this module replaces only
the parts that broke under a probe with raw JSON-RPC, by subclassing `LanguageServerProtocol`
and by reading the stream itself (pygls's `io_.run_async` cannot resynchronise).

Promises:
- Framing: headers are read case-insensitively and may end in "\\n" alone. A stated length
  that is wrong (short or long) costs at most that one message: the body is read as the JSON
  value that is there, and reading resumes at the next `Content-Length` header. So does any
  garbage between messages. A length over `MAX_MESSAGE_BYTES` is refused with an error (no
  buffer of that size is ever allocated) and the server keeps serving.
- Parsing: a body that is not UTF-8 or not JSON is answered with ParseError (-32700), with the
  request's id where one can be read. Only the top-level object is a JSON-RPC message: params
  may hold any keys, "jsonrpc" included (pygls parsed every nested object as a message and
  dropped the whole request). A top-level value that is not an object is InvalidRequest.
- Malformed params: a request gets InvalidParams naming the fields; a notification is logged.
- Lifecycle (LSP "Server lifecycle"): requests before `initialize` get ServerNotInitialized
  (-32002), notifications then are dropped; a second `initialize` is refused with
  InvalidRequest, the open documents stay; after `shutdown` every request but `exit` gets
  InvalidRequest; `exit` ends the session with code 0 after `shutdown`, 1 without.
- A request the client cancelled before its handler ran a line is reported to
  `cancelled_before_start(method)`, since nothing in the handler can see it.
- Memory: pygls keeps a future per handled notification in `_request_futures` and never drops
  it (about 1.9 KB a keystroke); here every handler's future leaves the table once done.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import re
from typing import Any, Awaitable, Callable

import attrs
import cattrs
from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidRequest
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.language_server import lsp_method

from codespec_lsp.lsp import documents
log = logging.getLogger("codespec_lsp.protocol")

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# How long a body that stated more bytes than arrived may wait before it is read as it is.
STALL_S = 0.25

_HEADER = re.compile(rb"content-length[ \t]*:[ \t]*(\d+)", re.IGNORECASE)
_NAME_VALUE = re.compile(rb"^[A-Za-z0-9-]+[ \t]*:")
SERVER_NOT_INITIALIZED = -32002
_TASK_PREFIX = "lsp-request:"


# ------------------------------------------------------------------------------ framing


@attrs.define
class Refused:
    """A message the framer would not read (its stated length is over the limit)."""

    reason: str


class Framer:
    """Bytes in, message bodies out: `Content-Length` framing that recovers from mistakes.

    `feed` returns the bodies (bytes) and refusals completed by new data; `stalled` is called
    when no data came for a while and returns a body whose stated length was too long.
    """

    _SCAN_KEEP = 64  # bytes kept while scanning a long line for a header
    _EARLY_CHECK = 1 << 20
    _LOOKAHEAD = 1 << 16  # how far past a stated length a misframed body is looked for

    def __init__(self, limit: int = MAX_MESSAGE_BYTES) -> None:
        self.limit = limit
        self.buf = bytearray()
        self.length: int | None = None  # the stated length, once its header is read
        self.in_body = False           # the blank line after the headers was read

    def feed(self, data: bytes) -> list[bytes | Refused]:
        self.buf += data
        out: list[bytes | Refused] = []
        while True:
            item = self._body() if self.in_body else self._header()
            if item is None:
                return out
            if item is not True:
                out.append(item)

    def stalled(self) -> list[bytes]:
        """No data for a while: a partial body that is a whole JSON value was misframed."""
        if self.in_body and self.buf and (end := _json_end(self.buf)) is not None and \
                not self.buf[end:].strip():
            body = bytes(self.buf[:end])
            log.warning("message body shorter (%d bytes) than its Content-Length (%d)",
                        end, self.length)
            del self.buf[:]
            self._reset()
            return [body]
        return []

    def _reset(self) -> None:
        self.length, self.in_body = None, False

    def _header(self) -> bytes | Refused | bool | None:
        """Consume one header line; True when consumed, None when a line is incomplete."""
        nl = self.buf.find(b"\n")
        if nl < 0:
            if len(self.buf) > 65536:  # a long run of garbage: keep only a possible header start
                log.warning("skipped %d bytes that are not a message header", len(self.buf))
                del self.buf[:-self._SCAN_KEEP]
            return None
        line = bytes(self.buf[:nl]).rstrip(b"\r")
        del self.buf[:nl + 1]
        if not line.strip():
            if self.length is None:
                return True  # a blank line outside a message: noise
            self.in_body = True
            return True
        m = _HEADER.search(line)
        if m is not None:
            if m.start() > 0 and line[:m.start()].strip():
                log.warning("skipped %d bytes before a header", m.start())
            length = int(m.group(1))
            if length > self.limit:
                self._reset()
                return Refused(f"message of {length} bytes refused: the limit is {self.limit}")
            self.length = length
        elif not _NAME_VALUE.match(line):
            log.warning("skipped a line that is not a message header (%d bytes)", len(line))
            self._reset()
        return True

    def _body(self) -> bytes | None:
        assert self.length is not None
        n = self.length
        if len(self.buf) < n:
            # Too long a stated length, with the next message already here: read what is there.
            # (Only for small buffers: a large legit body arrives in many chunks.)
            if len(self.buf) > self._EARLY_CHECK or not _HEADER.search(self.buf):
                return None
            end = _json_end(self.buf)
            if end is not None and _HEADER.match(bytes(self.buf[end:end + 40]).lstrip()):
                return self._take(end)
            return None
        if _json_end(self.buf[:n]) == n or n == 0:
            return self._take(n)
        # The stated length cuts a JSON value or runs into the next message: take the value
        # that starts here if it is whole and is followed by a header or by nothing.
        end = _json_end(self.buf[:n + self._LOOKAHEAD])
        if end is not None and end != n:
            rest = bytes(self.buf[end:end + 40]).lstrip()
            if not rest or _HEADER.match(rest):
                log.warning("message body of %d bytes under a Content-Length of %d", end, n)
                return self._take(end)
        return self._take(n)

    def _take(self, n: int) -> bytes:
        body = bytes(self.buf[:n])
        del self.buf[:n]
        self._reset()
        return body


_decoder = json.JSONDecoder()


def _json_end(data: bytes | bytearray) -> int | None:
    """Byte offset where the JSON value at the start of `data` ends, or None."""
    # surrogateescape: bytes that are not UTF-8, in this value (answered -32700 later) or in a
    # message after it, must not hide where this value ends (a strict decode failed on them and
    # the framer then cut the next, valid message).
    text = bytes(data).decode("utf-8", "surrogateescape")
    start = len(text) - len(text.lstrip())
    try:
        _, end = _decoder.raw_decode(text, start)
    except ValueError:
        return None
    return end if text.isascii() else len(text[:end].encode("utf-8", "surrogateescape"))


async def read_stream(protocol: "HardenedProtocol",
                      read: Callable[[], Awaitable[bytes]],
                      limit: int = MAX_MESSAGE_BYTES) -> None:
    """Feed `read()`'s chunks through a Framer into `protocol` until EOF or `exit`."""
    framer = Framer(limit)
    pending: asyncio.Future | None = None
    while not protocol.ended:
        pending = pending or asyncio.ensure_future(read())
        timeout = STALL_S if framer.in_body else None
        done, _ = await asyncio.wait({pending}, timeout=timeout)
        if not done:
            items: list[bytes | Refused] = list(framer.stalled())
        else:
            chunk, pending = pending.result(), None
            if not chunk:
                break
            items = framer.feed(chunk)
        for item in items:
            if isinstance(item, Refused):
                log.warning("%s", item.reason)
                protocol.send_error(None, types.ErrorCodes.InvalidRequest, item.reason)
            else:
                protocol.receive(item)
            if protocol.ended:
                break
    if pending is not None:
        pending.cancel()


# ------------------------------------------------------------------------------ protocol


@attrs.define
class _Malformed:
    """A request whose params did not match the LSP types; answered with InvalidParams."""

    id: Any
    method: str
    detail: str
    jsonrpc: str = "2.0"


class HardenedProtocol(LanguageServerProtocol):
    """`LanguageServerProtocol` with the guarantees in this module's docstring."""

    exit_code: int | None = None  # set by `exit`
    _initialized = False


    @property
    def ended(self) -> bool:
        """`exit` was received: the session is over."""
        return self.exit_code is not None

    # ---------------------------------------------------------------- errors out

    def send_error(self, msg_id: Any, code: int, message: str) -> None:
        # A plain dict: lsprotocol's converter would drop a null id.
        self._send_data({"jsonrpc": "2.0", "id": msg_id,
                         "error": {"code": int(code), "message": message}})

    # ---------------------------------------------------------------- messages in

    def receive(self, body: bytes | str) -> None:
        """Handle one message body; every failure is answered or logged, never raised."""
        try:
            text = body.decode("utf-8") if isinstance(body, bytes) else body
        except UnicodeDecodeError as exc:
            msg_id = _readable_id(body)  # type: ignore[arg-type]
            log.warning("message is not UTF-8: %s", exc)
            self.send_error(msg_id, types.ErrorCodes.ParseError,
                            f"parse error: the message is not UTF-8 ({exc})")
            return
        try:
            data = json.loads(text)
        except ValueError as exc:
            log.warning("message is not JSON: %s", exc)
            self.send_error(None, types.ErrorCodes.ParseError, f"parse error: {exc}")
            return
        if not isinstance(data, dict):
            self.send_error(None, types.ErrorCodes.InvalidRequest,
                            "invalid request: a message is a JSON object (batches are not "
                            "supported)")
            return
        try:
            message = self.structure_message(data)
        except Exception as exc:
            if "id" in data and "method" in data:
                self.send_error(data["id"], types.ErrorCodes.InvalidRequest,
                                f"invalid request: {exc}")
            else:
                self._server._report_server_error(exc, JsonRpcException)
            return
        try:
            self.handle_message(message)
        except Exception as exc:
            log.exception("failed to handle a message")
            self._server._report_server_error(exc, JsonRpcException)

    def structure_message(self, data: dict[str, Any]) -> Any:
        if "jsonrpc" in data and "method" in data:
            # JSON-RPC lets a request omit params (vscode-jsonrpc does for `codespec/stats`).
            data.setdefault("params", None)
        try:
            return super().structure_message(data)
        except JsonRpcException as exc:
            cause = exc.__cause__
            if isinstance(cause, cattrs.ClassValidationError):
                detail = "; ".join(cattrs.transform_error(cause, path="params"))
            else:
                detail = str(cause or exc)
            if "id" in data and "method" in data:
                return _Malformed(data["id"], str(data["method"]), detail)
            raise JsonRpcException(
                f"invalid params for {data.get('method', '?')}: {detail}") from exc

    def handle_message(self, message: Any) -> None:
        method = getattr(message, "method", None)
        msg_id = getattr(message, "id", None)
        is_request = method is not None and hasattr(message, "id")
        if isinstance(message, _Malformed):
            log.warning("invalid params for %s: %s", message.method, message.detail)
            self.send_error(message.id, types.ErrorCodes.InvalidParams,
                            f"invalid params for {message.method}: {message.detail}")
            return
        if getattr(message, "jsonrpc", None) != self.VERSION:
            if is_request:
                self.send_error(msg_id, types.ErrorCodes.InvalidRequest,
                                'invalid request: "jsonrpc" must be "2.0"')
            return
        if method == types.EXIT or method is None:
            super().handle_message(message)  # exit, responses to our requests
        elif self._shutdown:
            if is_request:
                self.send_error(msg_id, types.ErrorCodes.InvalidRequest,
                                f"invalid request: {method} after shutdown (only exit is "
                                f"accepted)")
            else:
                log.info("ignoring %s after shutdown", method)
        elif not self._initialized and method != types.INITIALIZE:
            if is_request:
                self.send_error(msg_id, SERVER_NOT_INITIALIZED,
                                f"server not initialized: send initialize before {method}")
            else:
                log.info("ignoring %s before initialize", method)
        else:
            super().handle_message(message)

    def _execute_handler(self, msg_id, handler, callback, args=None, kwargs=None) -> None:
        super()._execute_handler(msg_id, handler, callback, args, kwargs)
        # pygls files the future of every handler under `msg_id` but only a request's answer
        # removes it: notifications (one per keystroke) and the steps of its built-in
        # handlers stayed for good. No upstream fix as of pygls 2.1.1; the same class of leak
        # for outgoing requests is https://github.com/openlawlibrary/pygls/issues/608.
        fut = self._request_futures.get(msg_id)
        if fut is not None:
            fut.add_done_callback(lambda f, i=msg_id: self._forget_future(i, f))

    def _handle_request(self, msg_id: Any, method_name: str, params: Any) -> None:
        super()._handle_request(msg_id, method_name, params)
        if isinstance(task := self._request_futures.get(msg_id), asyncio.Task):
            task.set_name(f"{_TASK_PREFIX}{method_name}")  # for cancelled_before_start

    def _handle_cancel_notification(self, msg_id: Any) -> None:
        task = self._request_futures.get(msg_id)
        unstarted = (isinstance(task, asyncio.Task) and task.get_name().startswith(_TASK_PREFIX)
                     and inspect.getcoroutinestate(task.get_coro()) == inspect.CORO_CREATED)
        super()._handle_cancel_notification(msg_id)  # pops the task and cancels it
        if unstarted and msg_id not in self._request_futures:
            self.cancelled_before_start(task.get_name()[len(_TASK_PREFIX):])

    def cancelled_before_start(self, method: str) -> None:
        """A request was cancelled before its handler ran a line, so nothing in the handler
        saw it: a subclass that counts requests counts it here."""

    def _forget_future(self, msg_id: Any, fut: Any) -> None:
        if self._request_futures.get(msg_id) is fut:
            del self._request_futures[msg_id]

    # ---------------------------------------------------------------- lifecycle

    @lsp_method(types.INITIALIZE)
    def lsp_initialize(self, params: types.InitializeParams):
        if self._initialized:
            # pygls would build a new workspace and drop every open document.
            raise JsonRpcInvalidRequest("initialize was already received in this session")
        self._initialized = True
        gen = super().lsp_initialize(params)
        # The workspace exists once pygls's handler first yields (to the user's handler, which
        # must see the right one) or returns: swap in ours, which reads documents the LSP way.
        try:
            step = next(gen)
        except StopIteration as stop:
            self._workspace = documents.Workspace.like(self.workspace)
            return stop.value
        self._workspace = documents.Workspace.like(self.workspace)
        value = yield step
        while True:
            try:
                step = gen.send(value)
            except StopIteration as stop:
                return stop.value
            value = yield step

    @lsp_method(types.SHUTDOWN)
    def lsp_shutdown(self, *args):
        if (user_handler := self.fm.features.get(types.SHUTDOWN)) is not None:
            yield user_handler, args, None
        # pygls cancels the other futures while iterating the table, and a cancelled future's
        # done callback (ours, above) leaves the table: iterate over a copy.
        current_id = self.msg_id
        for msg_id, future in list(self._request_futures.items()):
            if msg_id != current_id and not future.done():
                future.cancel()
        self._shutdown = True
        return None

    @lsp_method(types.EXIT)
    def lsp_exit(self, *args):
        if (user_handler := self.fm.features.get(types.EXIT)) is not None:
            yield user_handler, args, None
        # pygls raised SystemExit(1) here, which its own loop swallowed: the process exited 0.
        self.exit_code = 0 if self._shutdown else 1
        log.info("exit (code %d)", self.exit_code)


def _readable_id(body: bytes) -> Any:
    """The id of a request whose body is not UTF-8, read leniently, or None."""
    try:
        data = json.loads(body.decode("utf-8", "replace"))
    except ValueError:
        return None
    if isinstance(data, dict) and isinstance(data.get("id"), (int, str)) and "method" in data:
        return data["id"]
    return None
