"""The LSP layer: pygls handlers that translate LSP ⇄ plain objects, nothing more.

Promises:
- `textDocument/inlineCompletion` is advertised (registered with its options) and served;
  `textDocument/completion` is served too and advertised to clients that lack inline completion.
- Positions are in the negotiated encoding (UTF-16 unless the client offers better); returned
  ranges are built from the request's own positions, so non-ASCII lines round-trip exactly.
- With the editor's suggest widget open (`context.selectedCompletionInfo`), the answer is for the
  text with the selected item in place and replaces the item's range, starting with its text:
  VS Code shows nothing else while the widget is open.
- Models load in the background after `initialized`, with workDoneProgress; until then, and
  after a failed load, requests answer empty at once. A failure is shown, logged, and the
  server keeps serving.
- Bad input gets a clear error or an empty answer: unknown document → InvalidParams; position
  past the end → empty; malformed params → InvalidParams (pygls alone would drop the request
  and leave the client waiting); a non-JSON message → a JSON-RPC parse error. Framing,
  parsing and the lifecycle are lsp_protocol.py's; the document model is documents.py's; one
  session per connection is transport.py's.
- Errors outside requests are logged, and shown at most once per kind.
- `codespec/ready` is sent when the models are loaded (and at `initialized` when they already
  are); `codespec/documentText` answers the server's copy of a document.
- Handlers are async and never touch tensors; engine work happens in scheduler.py's worker.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import re
import sys
import uuid
from typing import Any, Callable

from lsprotocol import types
from pygls.exceptions import FeatureRequestError, JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer
from pygls.protocol.language_server import lsp_method

from codespec_lsp import config
from codespec_lsp.lsp import documents
from codespec_lsp.lsp import transport
from codespec_lsp.lsp.protocol import HardenedProtocol
from codespec_lsp.lsp.host import EngineHost, LoadOutcome, default_loader
from codespec_lsp.lsp.scheduler import CompletionRequest, Outcome, Scheduler
from codespec_lsp.stats import RequestStats

log = logging.getLogger("codespec_lsp")

STATS = "codespec/stats"
COUNTERS = "codespec/counters"
DID_SHOW = "codespec/didShowCompletion"
DID_PARTIALLY_ACCEPT = "codespec/didPartiallyAcceptCompletion"
ACCEPT_COMMAND = "codespec.didAcceptCompletion"
DOCUMENT_TEXT = "codespec/documentText"  # the server's copy of a document (tests compare it)
READY = "codespec/ready"  # sent when the models are loaded: clients ask again then
MAX_OTHER_DOCUMENTS = 8
COMPLETION_TRIGGERS = [".", "(", "[", ",", "="]
_SNIPPET_FIELD = re.compile(r"\$(?:\d|\{\d)")  # a snippet's tab stop or placeholder


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("codespec-lsp")
    except Exception:
        return "0"


class CodespecProtocol(HardenedProtocol):
    @lsp_method(types.INITIALIZE)
    def lsp_initialize(self, params: types.InitializeParams):
        result = yield from super().lsp_initialize(params)
        # Editors with inline completion would show our suggestion twice (ghost text and the
        # completion menu) and pay for it twice: advertise the fallback only where it is needed.
        if _client_has_inline(params.capabilities):
            result.capabilities.completion_provider = None
        return result

    def cancelled_before_start(self, method: str) -> None:
        # A completion cancelled before its handler ran (request and cancel read together, as
        # editors send them while typing) never reaches the scheduler: counted here, so every
        # completion request is counted once.
        if method in (types.TEXT_DOCUMENT_INLINE_COMPLETION, types.TEXT_DOCUMENT_COMPLETION):
            self._server.stats.cancelled_before_start()


def _client_has_inline(caps: types.ClientCapabilities) -> bool:
    return bool(caps.text_document and caps.text_document.inline_completion is not None)


class CodespecServer(LanguageServer):
    protocol: CodespecProtocol

    def __init__(self, loader=default_loader, host: EngineHost | None = None,
                 worker: concurrent.futures.Executor | None = None) -> None:
        super().__init__("codespec-lsp", _version(), protocol_cls=CodespecProtocol)
        self.layers = config.SettingsLayers()
        self.settings = self.layers.effective()
        # A TCP/WebSocket server hands one host (the loaded models) from session to session;
        # its messages go to the session now connected.
        self.host = host or EngineHost(loader)
        self._notify = lambda level, message: self.show(
            types.MessageType.Error if level == "error" else types.MessageType.Info, message)
        self.host.notify = self._notify
        # Sessions of one TCP/WebSocket server take turns on the engine's one thread (`worker`):
        # the in-process engine (its KV caches) is not safe to use from two threads at once.
        self.stats = RequestStats()
        self.scheduler = Scheduler(self.host, lambda: self.settings, stats=self.stats,
                                   executor=worker)
        self._pending_messages: list[tuple[types.MessageType, str]] = []
        self._tasks: set[asyncio.Task] = set()
        self._errors_shown: set[str] = set()

    # -------------------------------------------------------- plumbing used by handlers

    def report_server_error(self, error: Exception, source) -> None:
        """Errors outside a request: logged; shown to the user once per kind, not per message.

        pygls shows every one (a dialog per malformed notification: one per keystroke).
        Request errors are already in their responses.
        """
        log.warning("%s: %s", getattr(source, "__name__", source), error)
        if source is FeatureRequestError:
            return
        kind = f"{getattr(source, '__name__', source)}:{type(error).__name__}"
        if kind in self._errors_shown:
            return
        self._errors_shown.add(kind)
        self.window_show_message(types.ShowMessageParams(
            type=types.MessageType.Error,
            message=f"codespec: {error} (further errors of this kind are only logged)"))

    async def end_session(self) -> None:
        """The client is gone: cancel engine work and wait until the engine thread is idle."""
        if self.host.notify is self._notify:
            self.host.notify = None
        self.scheduler.close()
        await self.scheduler.drain()

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
        _apply_log_level(self.settings)
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
                self.notify_ready()
            else:
                self.show(types.MessageType.Error, outcome.message)
            if outcome.warning:
                self.show(types.MessageType.Warning, f"codespec: {outcome.warning}")

        await self.host.load(self.settings, on_start, on_done)

    def notify_ready(self) -> None:
        """Tell the client the models are loaded: requests answered empty before can be asked
        again (Neovim asks once per cursor position, not again on its own)."""
        engine = self.host.engine
        self.protocol.notify(READY, {
            "state": self.host.state,
            "target": getattr(engine, "target_name", None),
            "draft": getattr(engine, "draft_name", None)})

    def document(self, uri: str) -> documents.Document:
        docs = self.workspace.text_documents
        doc = docs.get(uri) or docs.get(_unquote(uri))
        if doc is None:
            raise JsonRpcInvalidParams(
                f"unknown document {uri!r}: send textDocument/didOpen before asking for "
                f"completions")
        return doc

    def request_for(self, uri: str, position: types.Position,
                    selected: types.SelectedCompletionInfo | None = None
                    ) -> CompletionRequest | None:
        """The plain request for a position; None when the position is past the end.
        `selected`: the editor's completion item to complete after (_selected_item): the request
        is for the text as it reads with the item's text in its range, the cursor after it."""
        doc = self.document(uri)
        # Checked here rather than left to pygls, which clamps out-of-range characters.
        offset = doc.offset_at(position, strict=True)
        span = (doc.offset_at(selected.range.start, strict=True),
                doc.offset_at(selected.range.end, strict=True)) if selected else (offset, offset)
        if offset is None or None in span:
            log.info("position %s:%s is past the end of %s", position.line,
                     position.character, uri)
            return None
        source = doc.source
        if selected:
            source = source[:span[0]] + selected.text + source[span[1]:]
            offset = span[0] + len(selected.text)
        # The text as the client sent it: the scheduler makes what goes to the tokenizer safe.
        docs = self.workspace.text_documents
        others = [(u, d.source) for u, d in docs.items() if d is not doc]
        roots = [f.uri for f in self.workspace.folders.values()] or \
            ([self.workspace.root_uri] if self.workspace.root_uri else [])
        # The request id and position as the client sent them: the scheduler's debug line
        # per request names them, so a client's log can be matched line for line.
        edits = documents.edited_chunks(d for d in docs.values() if d is not doc)
        return CompletionRequest(uri, source, offset,
                                 others[:MAX_OTHER_DOCUMENTS], roots=roots, edits=edits,
                                 request_id=self.protocol.msg_id,
                                 position=(position.line, position.character))


def _unquote(uri: str) -> str:
    from urllib.parse import unquote
    return unquote(uri)


def _supports_progress(ls: LanguageServer) -> bool:
    caps = ls.client_capabilities
    return bool(caps and caps.window and caps.window.work_done_progress)


def _word_before(line_prefix: str) -> str:
    i = len(line_prefix)
    while i > 0 and (line_prefix[i - 1].isalnum() or line_prefix[i - 1] == "_"):
        i -= 1
    return line_prefix[i:]


# ------------------------------------------------------------------ handlers
# Thin and module-level (as pygls's examples and jedi-language-server): each translates LSP to
# a call on a plain object (settings layers, the scheduler, the stats) and the answer back.


def initialize(ls: CodespecServer, params: types.InitializeParams) -> None:
    errors, unknown = ls.layers.set_init(params.initialization_options)
    ls.settings = ls.layers.effective()
    _apply_log_level(ls.settings)
    ls._pending_messages += [
        (types.MessageType.Error, f"codespec: ignoring invalid initializationOptions "
                                  f"setting: {e}") for e in errors]
    if unknown:
        log.info("ignoring unknown initializationOptions: %s", ", ".join(unknown))


async def initialized(ls: CodespecServer, params: types.InitializedParams) -> None:
    for kind, msg in ls._pending_messages:
        ls.show(kind, msg)
    ls._pending_messages = []
    if ls.host.state == "ready" and not ls.host.needs_load(ls.settings):
        ls.notify_ready()  # a later TCP/WebSocket session on models already loaded
    ls.spawn(ls.load_models())


def did_change_configuration(ls: CodespecServer,
                             params: types.DidChangeConfigurationParams) -> None:
    # Not a coroutine: pygls would run it as a task, and a request read in the same chunk
    # (a completion right after the change) could be answered under the old settings first.
    caps = ls.client_capabilities
    if params.settings is None and caps and caps.workspace and caps.workspace.configuration:
        # Pull model: the notification only says "something changed"; asking takes a round trip.
        ls.spawn(pull_configuration(ls))
        return
    errors, unknown = ls.layers.set_workspace(params.settings)
    ls.apply_settings(errors, unknown, "workspace")


async def pull_configuration(ls: CodespecServer) -> None:
    try:
        settings = (await ls.workspace_configuration_async(types.ConfigurationParams(
            items=[types.ConfigurationItem(section=config.SECTION)])))[0]
    except Exception as exc:
        log.warning("workspace/configuration failed: %s", exc)
        return
    errors, unknown = ls.layers.set_workspace(settings)
    ls.apply_settings(errors, unknown, "workspace")


def did_close(ls: CodespecServer, params: types.DidCloseTextDocumentParams) -> None:
    ls.scheduler.forget(params.text_document.uri)


async def inline_completion(ls: CodespecServer, params: types.InlineCompletionParams
                            ) -> types.InlineCompletionList:
    selected = _selected_item(params)
    req = ls.request_for(params.text_document.uri, params.position, selected)
    out = await ls.scheduler.complete(req) if req is not None else None
    if out is None or not out.text:
        return types.InlineCompletionList(items=[])
    if selected is None:
        start, end, text = params.position, params.position, out.text
    else:
        # With the suggest widget open, VS Code shows only an answer that replaces the selected
        # item's range and starts with its text: anything else stays hidden behind the widget.
        start, end, text = selected.range.start, selected.range.end, selected.text + out.text
    return types.InlineCompletionList(items=[types.InlineCompletionItem(
        insert_text=text, range=types.Range(start=start, end=_past(end, out.replace)),
        command=_accepted(out.id))])


def _selected_item(params: types.InlineCompletionParams) -> types.SelectedCompletionInfo | None:
    """The completion item the editor's suggest widget has selected, when the answer can follow
    it: its range on the cursor's line and around the cursor, its text one line and no snippet
    (`$1`, `${1:x}` would be typed as they read). None: answer for the text as it is."""
    info = params.context.selected_completion_info if params.context else None
    if info is None:
        return None
    start, end, at = info.range.start, info.range.end, params.position
    if not (start.line == end.line == at.line and start.character <= at.character <= end.character):
        return None
    if "\n" in info.text or "\r" in info.text or _SNIPPET_FIELD.search(info.text):
        return None
    return info


async def completion(ls: CodespecServer, params: types.CompletionParams
                     ) -> types.CompletionList:
    req = ls.request_for(params.text_document.uri, params.position)
    out = await ls.scheduler.complete(req) if req is not None else None
    items = [] if out is None or not out.text else [_completion_item(ls, params, req, out)]
    # Incomplete: the client asks again as the user types, which typing-through answers.
    return types.CompletionList(is_incomplete=True, items=items)


def did_accept(ls: CodespecServer, *args: Any) -> None:
    cid = args[0] if args and isinstance(args[0], str) else \
        _completion_id(args[0]) if args else None
    if cid is None:
        raise JsonRpcInvalidParams(
            f"{ACCEPT_COMMAND} takes the completion's id (a string), got {args!r:.80}")
    ls.stats.feedback("accepted", cid)


def document_text(ls: CodespecServer, params: Any) -> dict:
    uri = _get(_get(params, "textDocument"), "uri")
    if not isinstance(uri, str):
        raise JsonRpcInvalidParams(f"{DOCUMENT_TEXT} takes {{textDocument: {{uri}}}}")
    doc = ls.document(uri)
    return {"uri": uri, "version": doc.version, "text": doc.source}


def did_show(ls: CodespecServer, params: Any) -> None:
    ls.stats.feedback("shown", _completion_id(params))


def did_partially_accept(ls: CodespecServer, params: Any) -> None:
    ls.stats.feedback("partial", _completion_id(params))


def stats(ls: CodespecServer, params: Any) -> dict:
    return ls.stats.report(ls.host)


def counters(ls: CodespecServer, params: Any) -> dict:
    return ls.stats.counters(ls.host)


def shutdown(ls: CodespecServer, params: Any) -> None:
    ls.scheduler.close()


_FEATURES: list[tuple[str, Any, Callable[..., Any]]] = [
    (types.INITIALIZE, None, initialize),
    (types.INITIALIZED, None, initialized),
    (types.WORKSPACE_DID_CHANGE_CONFIGURATION, None, did_change_configuration),
    (types.TEXT_DOCUMENT_DID_CLOSE, None, did_close),
    (types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions(), inline_completion),
    (types.TEXT_DOCUMENT_COMPLETION,
     types.CompletionOptions(trigger_characters=COMPLETION_TRIGGERS), completion),
    (DOCUMENT_TEXT, None, document_text),
    (DID_SHOW, None, did_show),
    (DID_PARTIALLY_ACCEPT, None, did_partially_accept),
    (STATS, None, stats),
    (COUNTERS, None, counters),
    (types.SHUTDOWN, None, shutdown),
]


def _past(position: types.Position, chars: int) -> types.Position:
    """`chars` closers right of the position: ASCII, one unit each in every encoding."""
    return types.Position(line=position.line, character=position.character + chars)


def _accepted(completion_id: str | None) -> types.Command:
    return types.Command(title="codespec: accepted", command=ACCEPT_COMMAND,
                         arguments=[completion_id])


def _completion_item(ls: CodespecServer, params: types.CompletionParams,
                     req: CompletionRequest, out: Outcome) -> types.CompletionItem:
    # Clients filter items by the word before the cursor: the item replaces that word,
    # so its label and filter text must start with it.
    word = _word_before(req.line_prefix)
    doc = ls.workspace.get_text_document(req.key)
    start = types.Position(line=params.position.line, character=params.position.character
                           - doc.position_codec.client_num_units(word))
    text = word + out.text
    first_line = text.split("\n", 1)[0] or out.text.strip().split("\n")[0]
    return types.CompletionItem(
        label=first_line[:80], kind=types.CompletionItemKind.Snippet,
        detail="codespec", filter_text=text, sort_text="0", preselect=True,
        insert_text_format=types.InsertTextFormat.PlainText,
        text_edit=types.TextEdit(range=types.Range(start=start,
                                                   end=_past(params.position, out.replace)),
                                 new_text=text),
        documentation=types.MarkupContent(kind=types.MarkupKind.Markdown,
                                          value=f"```python\n{text}\n```"),
        command=_accepted(out.id))


def build_server(args: Any = None, loader=default_loader, host: EngineHost | None = None,
                 worker: concurrent.futures.Executor | None = None) -> CodespecServer:
    server = CodespecServer(loader, host, worker)
    cli_values, cli_errors, _ = config.normalize(config.from_cli(args) if args else {})
    server.layers.cli = cli_values
    server.settings = server.layers.effective()
    _apply_log_level(server.settings)
    # Shown once the client can see messages (at `initialized`), not only logged.
    server._pending_messages = [
        (types.MessageType.Error, f"codespec: invalid command-line setting, using the default: "
                                  f"{err}") for err in cli_errors]
    for _, msg in server._pending_messages:
        log.error("%s", msg)
    for method, options, handler in _FEATURES:
        server.feature(method, options)(handler)
    server.command(ACCEPT_COMMAND)(did_accept)
    return server


def _get(obj: Any, key: str) -> Any:
    """pygls hands custom methods their params as namedtuples, other callers as dicts."""
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def _completion_id(params: Any) -> str | None:
    """Accepts {"id": ...} or Copilot's {"item": <the item we sent>} shape."""
    if isinstance(cid := _get(params, "id"), str):
        return cid
    args = _get(_get(_get(params, "item"), "command"), "arguments")
    return args[0] if isinstance(args, (list, tuple)) and args and \
        isinstance(args[0], str) else None


def _apply_log_level(settings: config.Settings) -> None:
    """`logLevel` / `--log-level`: "debug" adds one line per request (scheduler)."""
    if settings.log_level:
        logging.getLogger("codespec_lsp").setLevel(settings.log_level.upper())


def _setup_logging(log_file: str | None) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file))
    logging.basicConfig(level=logging.INFO, handlers=handlers,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # pygls logs every message body at INFO: far too much for a keystroke-rate server.
    logging.getLogger("pygls").setLevel(logging.WARNING)


def run_server(args: Any, loader=default_loader) -> int:
    """Serve on stdio, or on --tcp/--ws at --host (127.0.0.1 unless told otherwise).

    Returns the exit status: on stdio 0 after shutdown + exit, 1 without shutdown (LSP).
    """
    _setup_logging(getattr(args, "log_file", None))
    if not (getattr(args, "tcp", False) or getattr(args, "ws", False)):
        return transport.serve_stdio(build_server(args, loader))
    # One connection, one session (its own workspace, settings and scheduler); the models are
    # loaded once and the engine's one thread is shared, so sessions take turns on it.
    host = EngineHost(loader)
    worker = transport.SharedWorker("codespec-engine")

    def make_session() -> CodespecServer:
        return build_server(args, loader, host, worker)

    if getattr(args, "tcp", False):
        return transport.serve_tcp(make_session, args.host, args.port)
    return transport.serve_ws(make_session, args.host, args.port,
                              getattr(args, "allow_origin", None) or ())
