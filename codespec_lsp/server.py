"""The LSP layer: pygls handlers that translate LSP ⇄ plain objects, nothing more.

Promises:
- `textDocument/inlineCompletion` is advertised (registered with its options) and served;
  `textDocument/completion` is served too and advertised to clients that lack inline completion.
- Positions are in the negotiated encoding (UTF-16 unless the client offers better); returned
  ranges are built from the request's own position, so non-ASCII lines round-trip exactly.
- Models load in the background after `initialized`, with workDoneProgress; until then, and
  after a failed load, requests answer empty at once. A failure is shown, logged, and the
  server keeps serving.
- Bad input gets a clear error or an empty answer: unknown document → InvalidParams; position
  past the end → empty; malformed params → InvalidParams (pygls alone would drop the request
  and leave the client waiting); a non-JSON message → a JSON-RPC parse error.
- Handlers are async and never touch tensors; engine work happens in scheduler.py's worker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import uuid
from typing import Any

import attrs
import cattrs
from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.language_server import lsp_method

from codespec_lsp import config
from codespec_lsp.engine_host import EngineHost, LoadOutcome, default_loader
from codespec_lsp.scheduler import CompletionRequest, Scheduler

log = logging.getLogger("codespec_lsp")

STATS = "codespec/stats"
COUNTERS = "codespec/counters"
DID_SHOW = "codespec/didShowCompletion"
DID_PARTIALLY_ACCEPT = "codespec/didPartiallyAcceptCompletion"
ACCEPT_COMMAND = "codespec.didAcceptCompletion"
MAX_OTHER_DOCUMENTS = 8
COMPLETION_TRIGGERS = [".", "(", "[", ",", "="]


@attrs.define
class _Malformed:
    """A request whose params did not match the LSP types; answered with InvalidParams."""

    id: Any
    method: str
    detail: str
    jsonrpc: str = "2.0"


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("codespec-lsp")
    except Exception:
        return "0"


class CodespecProtocol(LanguageServerProtocol):
    def structure_message(self, data: dict[str, Any]):
        if isinstance(data, dict) and "jsonrpc" in data and "method" in data:
            # JSON-RPC lets a request omit params (vscode-jsonrpc does for `codespec/stats`).
            data.setdefault("params", None)
        try:
            return super().structure_message(data)
        except JsonRpcException as exc:
            if isinstance(data, dict) and "id" in data and "method" in data:
                cause = exc.__cause__
                if isinstance(cause, cattrs.ClassValidationError):
                    detail = "; ".join(cattrs.transform_error(cause, path="params"))
                else:
                    detail = str(cause or exc)
                return _Malformed(data["id"], str(data["method"]), detail)
            raise

    def handle_message(self, message):
        if isinstance(message, _Malformed):
            log.warning("invalid params for %s: %s", message.method, message.detail)
            self._send_response(message.id, error=types.ResponseError(
                code=types.ErrorCodes.InvalidParams,
                message=f"invalid params for {message.method}: {message.detail}"))
            return
        super().handle_message(message)

    @lsp_method(types.INITIALIZE)
    def lsp_initialize(self, params: types.InitializeParams):
        result = yield from super().lsp_initialize(params)
        # Editors with inline completion would show our suggestion twice (ghost text and the
        # completion menu) and pay for it twice: advertise the fallback only where it is needed.
        if _client_has_inline(params.capabilities):
            result.capabilities.completion_provider = None
        return result


def _client_has_inline(caps: types.ClientCapabilities) -> bool:
    return bool(caps.text_document and caps.text_document.inline_completion is not None)


class CodespecServer(LanguageServer):
    def __init__(self, loader=default_loader) -> None:
        super().__init__("codespec-lsp", _version(), protocol_cls=CodespecProtocol)
        self.layers = config.SettingsLayers()
        self.settings = self.layers.effective()
        self.host = EngineHost(loader)
        self.host.notify = lambda level, message: self.show(
            types.MessageType.Error if level == "error" else types.MessageType.Info, message)
        self.scheduler = Scheduler(self.host, lambda: self.settings)
        self._pending_messages: list[tuple[types.MessageType, str]] = []
        self._tasks: set[asyncio.Task] = set()

    # -------------------------------------------------------- plumbing used by handlers

    def report_server_error(self, error: Exception, source) -> None:
        if isinstance(error, json.JSONDecodeError) or isinstance(
                error.__cause__, json.JSONDecodeError):
            # JSON-RPC: an unparseable message is answered with a parse error and id null.
            log.warning("message is not JSON: %s", error)
            # Sent as a plain dict: lsprotocol's converter would drop the null id.
            self.protocol._send_data({"jsonrpc": "2.0", "id": None, "error": {
                "code": int(types.ErrorCodes.ParseError), "message": f"parse error: {error}"}})
            return
        super().report_server_error(error, source)

    def show(self, kind: types.MessageType, message: str) -> None:
        (log.error if kind == types.MessageType.Error else log.warning
         if kind == types.MessageType.Warning else log.info)("%s", message)
        self.window_show_message(types.ShowMessageParams(type=kind, message=message))

    def log_message(self, kind: types.MessageType, message: str) -> None:
        log.info("%s", message)
        self.window_log_message(types.LogMessageParams(type=kind, message=message))

    def spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def apply_settings(self, errors: list[str], unknown: list[str], origin: str) -> None:
        for err in errors:
            # The setting falls back to the layer below (CLI flag or default).
            self.show(types.MessageType.Error, f"codespec: ignoring invalid {origin} setting: "
                                               f"{err}")
        if unknown:
            log.info("ignoring unknown %s settings: %s", origin, ", ".join(unknown))
        self.settings = self.layers.effective()
        if self.host.needs_load(self.settings):
            self.spawn(self.load_models())

    async def load_models(self) -> None:
        token: str | None = None

        async def on_start(settings: config.Settings) -> None:
            nonlocal token
            token = None
            what = settings.target or settings.preset or "default preset"
            if _supports_progress(self):
                token = f"codespec-load-{uuid.uuid4().hex[:8]}"
                try:
                    await asyncio.wait_for(self.work_done_progress.create_async(token), 5)
                except Exception:
                    token = None  # a client that cannot show progress still gets the models
            if token is not None:
                self.work_done_progress.begin(token, types.WorkDoneProgressBegin(
                    title="codespec: loading models", message=what))
            self.log_message(types.MessageType.Info, f"codespec: loading {what}")

        def on_done(outcome: LoadOutcome) -> None:
            if token is not None:
                self.work_done_progress.end(token, types.WorkDoneProgressEnd(
                    message="ready" if outcome.ok else "failed"))
            if outcome.ok:
                self.log_message(types.MessageType.Info, outcome.message)
            else:
                self.show(types.MessageType.Error, outcome.message)
            if outcome.warning:
                self.show(types.MessageType.Warning, f"codespec: {outcome.warning}")

        await self.host.load(self.settings, on_start, on_done)

    def request_for(self, uri: str, position: types.Position) -> CompletionRequest | None:
        """The plain request for a position; None when the position is past the end."""
        docs = self.workspace.text_documents
        doc = docs.get(uri) or docs.get(_unquote(uri))
        if doc is None:
            raise JsonRpcInvalidParams(
                f"unknown document {uri!r}: send textDocument/didOpen before asking for "
                f"completions")
        offset = _offset(doc, position)
        if offset is None:
            log.info("position %s:%s is past the end of %s", position.line,
                     position.character, uri)
            return None
        others = [(_name(u), d.source) for u, d in docs.items() if d is not doc]
        return CompletionRequest(uri, doc.source, offset, others[:MAX_OTHER_DOCUMENTS])


def _unquote(uri: str) -> str:
    from urllib.parse import unquote
    return unquote(uri)


def _name(uri: str) -> str:
    return uri.rsplit("/", 1)[-1]


def _supports_progress(ls: LanguageServer) -> bool:
    caps = ls.client_capabilities
    return bool(caps and caps.window and caps.window.work_done_progress)


def _offset(doc, position: types.Position) -> int | None:
    """Code-point offset of a client position, or None when it lies past the end.

    Checked here rather than left to pygls, which clamps out-of-range characters to one short
    of the line end (and mutates the request's position while doing so).
    """
    if position.line < 0 or position.character < 0:
        return None
    lines = doc.lines
    if position.line >= len(lines):
        # The empty line after a final newline, or an empty document, is a real place.
        at_end = position.line == len(lines) and position.character == 0
        return len(doc.source) if at_end and (not lines or lines[-1].endswith("\n")) else None
    line = lines[position.line].rstrip("\r\n")
    if position.character > doc.position_codec.client_num_units(line):
        return None
    pos = doc.position_codec.position_from_client_units(lines, position)
    return sum(len(x) for x in lines[:position.line]) + pos.character


def _word_before(line_prefix: str) -> str:
    i = len(line_prefix)
    while i > 0 and (line_prefix[i - 1].isalnum() or line_prefix[i - 1] == "_"):
        i -= 1
    return line_prefix[i:]


def build_server(args: Any = None, loader=default_loader) -> CodespecServer:
    server = CodespecServer(loader)
    cli_values, cli_errors, _ = config.normalize(config.from_cli(args) if args else {})
    server.layers.cli = cli_values
    server.settings = server.layers.effective()
    for err in cli_errors:
        log.error("invalid command-line setting, using the default: %s", err)

    @server.feature(types.INITIALIZE)
    def initialize(ls: CodespecServer, params: types.InitializeParams) -> None:
        errors, unknown = ls.layers.set_init(params.initialization_options)
        ls.settings = ls.layers.effective()
        ls._pending_messages = [(types.MessageType.Error, e) for e in errors]
        if unknown:
            log.info("ignoring unknown initializationOptions: %s", ", ".join(unknown))

    @server.feature(types.INITIALIZED)
    async def initialized(ls: CodespecServer, params: types.InitializedParams) -> None:
        for kind, msg in ls._pending_messages:
            ls.show(kind, f"codespec: ignoring invalid initializationOptions setting: {msg}")
        ls._pending_messages = []
        ls.spawn(ls.load_models())

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    async def did_change_configuration(ls: CodespecServer,
                                       params: types.DidChangeConfigurationParams) -> None:
        settings = params.settings
        caps = ls.client_capabilities
        if settings is None and caps and caps.workspace and caps.workspace.configuration:
            # Pull model: the notification only says "something changed".
            try:
                settings = (await ls.workspace_configuration_async(types.ConfigurationParams(
                    items=[types.ConfigurationItem(section=config.SECTION)])))[0]
            except Exception as exc:
                log.warning("workspace/configuration failed: %s", exc)
                return
        errors, unknown = ls.layers.set_workspace(settings)
        ls.apply_settings(errors, unknown, "workspace")

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: CodespecServer, params: types.DidCloseTextDocumentParams) -> None:
        ls.scheduler.forget(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(ls: CodespecServer, params: types.InlineCompletionParams
                                ) -> types.InlineCompletionList:
        req = ls.request_for(params.text_document.uri, params.position)
        if req is None:
            return types.InlineCompletionList(items=[])
        out = await ls.scheduler.complete(req)
        if not out.text:
            return types.InlineCompletionList(items=[])
        here = types.Range(start=params.position, end=params.position)
        return types.InlineCompletionList(items=[types.InlineCompletionItem(
            insert_text=out.text, range=here,
            command=types.Command(title="codespec: accepted", command=ACCEPT_COMMAND,
                                  arguments=[out.id]))])

    @server.feature(types.TEXT_DOCUMENT_COMPLETION,
                    types.CompletionOptions(trigger_characters=COMPLETION_TRIGGERS))
    async def completion(ls: CodespecServer, params: types.CompletionParams
                         ) -> types.CompletionList:
        empty = types.CompletionList(is_incomplete=True, items=[])
        req = ls.request_for(params.text_document.uri, params.position)
        if req is None:
            return empty
        out = await ls.scheduler.complete(req)
        if not out.text:
            return empty
        # Clients filter items by the word before the cursor: the item replaces that word,
        # so its label and filter text must start with it.
        line_start = req.source.rfind("\n", 0, req.offset) + 1
        word = _word_before(req.source[line_start:req.offset])
        doc = ls.workspace.get_text_document(req.key)
        start = types.Position(line=params.position.line, character=params.position.character
                               - doc.position_codec.client_num_units(word))
        first_line = (word + out.text).split("\n", 1)[0] or out.text.strip().split("\n")[0]
        item = types.CompletionItem(
            label=first_line[:80], kind=types.CompletionItemKind.Snippet,
            detail="codespec", filter_text=word + out.text, sort_text="0", preselect=True,
            insert_text_format=types.InsertTextFormat.PlainText,
            text_edit=types.TextEdit(range=types.Range(start=start, end=params.position),
                                     new_text=word + out.text),
            documentation=types.MarkupContent(kind=types.MarkupKind.Markdown,
                                              value=f"```python\n{word + out.text}\n```"),
            command=types.Command(title="codespec: accepted", command=ACCEPT_COMMAND,
                                  arguments=[out.id]))
        # Incomplete: the client asks again as the user types, which typing-through answers.
        return types.CompletionList(is_incomplete=True, items=[item])

    @server.command(ACCEPT_COMMAND)
    def did_accept(ls: CodespecServer, *args: Any) -> None:
        ls.scheduler.record_feedback("accepted", args[0] if args else None)

    @server.feature(DID_SHOW)
    def did_show(ls: CodespecServer, params: Any) -> None:
        ls.scheduler.record_feedback("shown", _completion_id(params))

    @server.feature(DID_PARTIALLY_ACCEPT)
    def did_partially_accept(ls: CodespecServer, params: Any) -> None:
        ls.scheduler.record_feedback("partial", _completion_id(params))

    @server.feature(STATS)
    def stats(ls: CodespecServer, params: Any) -> dict:
        return ls.scheduler.stats_dict()

    @server.feature(COUNTERS)
    def counters(ls: CodespecServer, params: Any) -> dict:
        return ls.scheduler.counters()

    @server.feature(types.SHUTDOWN)
    def shutdown(ls: CodespecServer, params: Any) -> None:
        ls.scheduler.close()

    return server


def _completion_id(params: Any) -> str | None:
    """Accepts {"id": ...} or Copilot's {"item": <the item we sent>} shape.

    pygls hands custom methods their params as namedtuples, other callers as dicts.
    """
    def get(obj: Any, key: str) -> Any:
        return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)

    if isinstance(cid := get(params, "id"), str):
        return cid
    args = get(get(get(params, "item"), "command"), "arguments")
    return args[0] if isinstance(args, (list, tuple)) and args else None


def _setup_logging(log_file: str | None) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file))
    logging.basicConfig(level=logging.INFO, handlers=handlers,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # pygls logs every message body at INFO: far too much for a keystroke-rate server.
    logging.getLogger("pygls").setLevel(logging.WARNING)


def run_server(args: Any, loader=default_loader) -> int:
    """Serve on stdio, or on --tcp/--ws at --host (127.0.0.1 unless told otherwise)."""
    _setup_logging(getattr(args, "log_file", None))
    server = build_server(args, loader)
    if getattr(args, "tcp", False):
        server.start_tcp(args.host, args.port)
    elif getattr(args, "ws", False):
        server.start_ws(args.host, args.port)
    else:
        server.start_io()
    return 0
