"""`codespec-lsp bench server`: the real server over stdio, driven the way an editor drives it.

Replays typing of Python files one character per keystroke at a fixed interval, with one
inline-completion request per keystroke, cancelling the previous request if it is still pending
(as VS Code does). Writes JSON with exactly:
  keystrokes, answered, cancelled, superseded, typing_through_hits, latency_ms_p50,
  latency_ms_p95, wasted_forward_share, rss_mb_start, rss_mb_end, last_keystroke_answered,
  backend ("local", or the remote server's kind with --remote)
With --pause-ms P: Enter types the next line's indentation too (auto-indent), and the user pauses
P ms there before typing on; adds pauses, pause_shown (share of pauses answered with a
suggestion before the user typed on), pause_latency_ms_p50, pause_latency_ms_p95 (keystroke to
that suggestion).
With --clients N (or 1,2,4): N editors at once, each its own language server, one backend:
  {keystrokes_per_client, interval_ms, backend, runs: [{clients, latency_ms_p50, latency_ms_p95,
  errors, answered, per_client: [the fields above + errors]}]}; `transport` "stdio". With
  --clients N --tcp: one `serve --tcp` server and one connection (one session) per editor,
  `transport` "tcp".
With --soak: --documents files open at once (default 5), typed in turn with cancels, then:
  {keystrokes, documents, cancels_sent, answered_with_result, answered_cancelled,
  answered_with_error, unanswered, documents_equal, rss_mb_samples (every 500 keystrokes),
  rss_growth_mb, rss_growth_after_warmup_mb, interval_ms, exit_code, error_messages, backend}

- answered/cancelled/superseded/typing_through_hits: the server's own counts (codespec/stats).
- latency: client side, send → answer, over requests answered before the next keystroke
  cancelled them, plus the last one; what the user could have seen.
- wasted_forward_share: target forwards of generations whose answer nobody saw, over all.
- rss: the server process, after the models loaded and at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.lsp.client import LanguageClient

from codespec_lsp.stats import percentile

DEFAULT_CORPUS = Path(__file__).resolve().parent.parent.parent / "benchmarks" / "corpus"
CONTEXT_SHARE = 0.4  # each file starts with this much already written; the rest is typed
LAST_ANSWER_TIMEOUT_S = 120.0
KEYSTROKES_PER_FILE = 600
SOAK_SWITCH_EVERY = 40  # keystrokes in one file before the soak moves to the next
SOAK_RSS_EVERY = 500    # keystrokes between two RSS samples


@dataclass
class _Doc:
    uri: str
    lines: list[str]     # the document as typed so far, split on "\n"
    rest: str            # still to type
    version: int = 1
    line: int = 0
    col: int = 0         # code points

    def utf16_col(self) -> int:
        return len(self.lines[self.line][:self.col].encode("utf-16-le")) // 2


@dataclass
class _Tally:
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0  # requests answered with an error (a cancel is not one)
    pauses: int = 0  # requests made at a pause (--pause-ms)
    pause_latencies_ms: list[float] = field(default_factory=list)  # those answered with a suggestion


def _percentile(xs: list[float], q: float) -> float:
    return round(percentile(xs, q), 2)


def _documents(corpus: Path | None) -> list[tuple[str, str]]:
    root = Path(corpus) if corpus else DEFAULT_CORPUS
    files = sorted(p for p in root.rglob("*.py") if p.is_file())
    if not files:
        raise SystemExit(f"codespec-lsp bench server: no .py files under {root}")
    return [(p.resolve().as_uri(), p.read_text(encoding="utf-8", errors="replace")) for p in files]


def _typable(sources: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The files that leave something to type after the part given as context."""
    kept = [(uri, text) for uri, text in sources if _start_doc(uri, text).rest]
    if not kept:
        raise SystemExit("codespec-lsp bench server: no file in the corpus has anything to type "
                         "after its first 40% (add longer .py files)")
    return kept


def _start_doc(uri: str, text: str) -> _Doc:
    cut = text.rfind("\n", 0, int(len(text) * CONTEXT_SHARE)) + 1
    typed = text[:cut]
    lines = typed.split("\n")
    return _Doc(uri, lines, text[cut:], line=len(lines) - 1, col=len(lines[-1]))


def _server_command(args: Any) -> list[str]:
    cmd = [sys.executable, "-m", "codespec_lsp.cli", "serve"]
    for flag in ("preset", "draft", "target", "device", "dtype", "debounce_ms", "max_tokens",
                 "time_budget_ms",
                 "remote", "remote_model", "api_key_env"):
        value = getattr(args, flag, None)
        if value is not None and value != "":
            cmd += ["--" + flag.replace("_", "-"), str(value)]
    for flag in ("allow_download", "trust_remote_code", "exact"):
        if getattr(args, flag, False):
            cmd.append("--" + flag.replace("_", "-"))
    return cmd


class _Client(LanguageClient):
    def __init__(self) -> None:
        super().__init__("codespec-bench", "1")
        self.messages: list[str] = []

        @self.feature(types.WINDOW_WORK_DONE_PROGRESS_CREATE)
        def _create(params: types.WorkDoneProgressCreateParams) -> None:
            return None

        @self.feature(types.PROGRESS)
        def _progress(params: Any) -> None:
            return None

        self.errors: list[str] = []

        @self.feature(types.WINDOW_SHOW_MESSAGE)
        def _show(params: types.ShowMessageParams) -> None:
            self.messages.append(params.message)
            if params.type == types.MessageType.Error:
                self.errors.append(params.message)

        @self.feature(types.WINDOW_LOG_MESSAGE)
        def _log(params: types.LogMessageParams) -> None:
            return None

        @self.feature("codespec/ready")
        def _ready(params: Any) -> None:
            return None


async def _request(client: _Client, method: str) -> dict:
    return (await client.protocol.send_request_async(method, None))._asdict()


async def _drain(stream) -> None:
    # The server logs to stderr; an unread pipe would block it once the buffer fills.
    while stream is not None and await stream.read(65536):
        pass


async def _initialize(client: _Client) -> dict:
    """The handshake an inline-completion editor makes, then wait for the models."""
    caps = types.ClientCapabilities(
        text_document=types.TextDocumentClientCapabilities(
            inline_completion=types.InlineCompletionClientCapabilities()),
        window=types.WindowClientCapabilities(work_done_progress=True))
    await client.initialize_async(types.InitializeParams(capabilities=caps))
    client.initialized(types.InitializedParams())
    return await _wait_loaded(client)


async def _wait_loaded(client: _Client, limit_s: float = 900) -> dict:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        st = await _request(client, "codespec/stats")
        if st["state"] == "ready":
            return st
        if st["state"] == "error":
            raise SystemExit("codespec-lsp bench server: models failed to load: "
                             + "; ".join(client.messages))
        await asyncio.sleep(0.2)
    raise SystemExit("codespec-lsp bench server: models did not load in time")


def _keystroke(doc: _Doc, auto_indent: bool) -> int:
    """Characters the next keystroke types: one, or with `auto_indent` a newline and the next
    line's indentation together, as an editor's Enter does."""
    if not auto_indent or not doc.rest.startswith("\n"):
        return 1
    return 1 + len(doc.rest[1:]) - len(doc.rest[1:].lstrip(" \t"))


def _type_one(client: _Client, doc: _Doc, n: int = 1) -> None:
    """Type the next `n` characters of doc.rest (a newline only as the first of them)."""
    ch, doc.rest = doc.rest[:n], doc.rest[n:]
    at = types.Position(line=doc.line, character=doc.utf16_col())
    doc.version += 1
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=doc.uri, version=doc.version),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=at, end=at), text=ch)]))
    line = doc.lines[doc.line]
    if ch.startswith("\n"):
        doc.lines[doc.line:doc.line + 1] = [line[:doc.col], ch[1:] + line[doc.col:]]
        doc.line, doc.col = doc.line + 1, len(ch) - 1
    else:
        doc.lines[doc.line] = line[:doc.col] + ch + line[doc.col:]
        doc.col += len(ch)


def _ask(client: _Client, doc: _Doc, msg_id: str) -> asyncio.Future:
    params = types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=doc.uri),
        position=types.Position(line=doc.line, character=doc.utf16_col()),
        context=types.InlineCompletionContext(
            trigger_kind=types.InlineCompletionTriggerKind.Automatic))
    return client.protocol.send_request_async(types.TEXT_DOCUMENT_INLINE_COMPLETION, params,
                                              msg_id=msg_id)


def _shown(f: asyncio.Future) -> bool:
    result = f.result()
    return isinstance(result, types.InlineCompletionList) and any(
        str(getattr(item, "insert_text", "")).strip() for item in result.items)


async def replay(client: _Client, keystrokes: int, interval_s: float,
                 corpus: Path | None, first: int = 0, pause_s: float = 0.0) -> tuple[_Tally, bool]:
    """Type `keystrokes` keys `interval_s` apart. `pause_s`: Enter types the next line's
    indentation with it (auto-indent) and the user then pauses that long before typing on; the
    requests made there are the pause's (the suggestion a user waits for)."""
    # A few files, as in a real session: each file the user works in holds a KV prefix entry,
    # and switching among dozens of files would measure the cache bound, not the server.
    # `first`: where in the corpus this editor starts (editors typing at once type other files).
    # Files with nothing to type are left out: cycling over them alone raised StopIteration
    # inside this coroutine ("coroutine raised StopIteration").
    sources = _typable(_documents(corpus))
    sources = sources[first % len(sources):] + sources[:first % len(sources)]
    sources = sources[:max(1, min(len(sources), keystrokes // KEYSTROKES_PER_FILE))]
    per_file = max(1, -(-keystrokes // len(sources)))
    tally = _Tally()
    pending: tuple[str, asyncio.Future, float] | None = None
    seen_by_user: set[str] = set()
    at = time.perf_counter()
    doc: _Doc | None = None
    typed_in_doc = 0
    src_iter = itertools.cycle(sources)
    for k in range(keystrokes):
        if doc is None or typed_in_doc >= per_file or not doc.rest:
            uri, text = next(src_iter)
            doc, typed_in_doc = _start_doc(f"{uri}#{k}", text), 0
            client.text_document_did_open(types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(uri=doc.uri, language_id="python",
                                                     version=1, text="\n".join(doc.lines))))
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        if pending is not None and not pending[1].done():
            seen_by_user.discard(pending[0])
            client.cancel_request(types.CancelParams(id=pending[0]))
        n = _keystroke(doc, pause_s > 0)
        pause = pause_s > 0 and doc.rest.startswith("\n") and len(doc.rest) > n
        _type_one(client, doc, n)
        typed_in_doc += n
        at += pause_s if pause else interval_s
        msg_id = f"k{k}"
        fut = _ask(client, doc, msg_id)
        tally.pauses += pause
        sent = time.perf_counter()
        seen_by_user.add(msg_id)

        def done(f: asyncio.Future, msg_id: str = msg_id, sent: float = sent,
                 pause: bool = pause) -> None:
            # Retrieve the error of a cancelled request, or asyncio warns about it at exit.
            failed = f.cancelled() or f.exception() is not None
            if not f.cancelled() and f.exception() is not None and msg_id in seen_by_user:
                tally.errors += 1
            if msg_id in seen_by_user and not failed:
                ms = (time.perf_counter() - sent) * 1000
                tally.latencies_ms.append(ms)
                if pause and _shown(f):
                    tally.pause_latencies_ms.append(ms)

        fut.add_done_callback(done)
        pending = (msg_id, fut, sent)
    last_ok = False
    if pending is not None:
        try:
            result = await asyncio.wait_for(asyncio.shield(pending[1]), LAST_ANSWER_TIMEOUT_S)
            last_ok = isinstance(result, types.InlineCompletionList) or result is None
        except Exception:
            last_ok = False
    return tally, last_ok


async def run_bench(args: Any, server_command: list[str] | None = None) -> dict:
    """`server_command` replaces `codespec-lsp serve` (tests drive a fake-engine server)."""
    return (await _bench_one(args, server_command))[0]


async def _bench_one(args: Any, server_command: list[str] | None = None,
                     first: int = 0, tcp: tuple[int, int] | None = None) -> tuple[dict, _Tally]:
    """One editor: its result JSON, and its tally with the error count filled in.

    `tcp`: (port, pid) of a `serve --tcp` server to connect to instead of starting one.
    """
    import psutil

    client = _Client()
    if tcp is None:
        await client.start_io(*(server_command or _server_command(args)))
        drain = asyncio.ensure_future(_drain(client._server.stderr))
        pid = client._server.pid
    else:
        await client.start_tcp("127.0.0.1", tcp[0])
        drain, pid = asyncio.ensure_future(asyncio.sleep(0)), tcp[1]
    try:
        await _initialize(client)
        proc = psutil.Process(pid)
        rss_start = proc.memory_info().rss / 2**20
        s0 = await _request(client, "codespec/stats")
        c0 = await _request(client, "codespec/counters")
        pause_s = (getattr(args, "pause_ms", None) or 0) / 1000
        tally, last_ok = await replay(client, args.keystrokes, args.interval_ms / 1000,
                                      getattr(args, "corpus", None), first, pause_s)
        await asyncio.sleep(0.5)  # let cancelled generations finish so their forwards count
        s1 = await _request(client, "codespec/stats")
        c1 = await _request(client, "codespec/counters")
        rss_end = proc.memory_info().rss / 2**20
        await client.shutdown_async(None)
        client.exit(None)
    finally:
        try:
            await asyncio.wait_for(client.stop(), 10)
        except Exception:
            if tcp is None and client._server is not None and client._server.returncode is None:
                client._server.kill()
        drain.cancel()
    forwards = c1["target_forwards"] - c0["target_forwards"]
    wasted = c1["wasted_target_forwards"] - c0["wasted_target_forwards"]
    return {
        "keystrokes": args.keystrokes,
        "answered": s1["answered"] - s0["answered"],
        "cancelled": s1["cancelled"] - s0["cancelled"],
        "superseded": s1["superseded"] - s0["superseded"],
        "typing_through_hits": s1["typing_through_hits"] - s0["typing_through_hits"],
        "latency_ms_p50": _percentile(tally.latencies_ms, 0.5),
        "latency_ms_p95": _percentile(tally.latencies_ms, 0.95),
        "wasted_forward_share": round(wasted / forwards, 4) if forwards else 0.0,
        "rss_mb_start": round(rss_start, 1),
        "rss_mb_end": round(rss_end, 1),
        "last_keystroke_answered": last_ok,
        "backend": s1.get("backend", "local"),
        **(_pause_fields(tally) if pause_s else {}),
    }, dataclasses.replace(tally, errors=tally.errors + len(client.errors))


def _pause_fields(tally: _Tally) -> dict:
    """--pause-ms: keystroke-to-suggestion where the user waits for one, and how often one came
    before the user typed on."""
    shown = tally.pause_latencies_ms
    return {"pauses": tally.pauses,
            "pause_shown": round(len(shown) / tally.pauses, 4) if tally.pauses else 0.0,
            "pause_latency_ms_p50": _percentile(shown, 0.5),
            "pause_latency_ms_p95": _percentile(shown, 0.95)}


async def run_clients(args: Any, counts: list[int],
                      server_command: list[str] | None = None) -> dict:
    """N editors typing at once, each with its own language server, all against one backend
    (`--remote`: one vLLM, or several behind a load balancer): latency and errors per count.

    `--tcp`: one `serve --tcp` server instead, each editor a connection of its own (its own
    session), all sessions on the server's one engine."""
    runs = []
    for n in counts:
        if getattr(args, "tcp", False):
            async with _tcp_server(args, server_command) as tcp:
                done = await asyncio.gather(*(_bench_one(args, first=i, tcp=tcp)
                                              for i in range(n)))
        else:
            done = await asyncio.gather(*(_bench_one(args, server_command, first=i)
                                          for i in range(n)))
        pooled = [x for _, tally in done for x in tally.latencies_ms]
        runs.append({
            "clients": n,
            "latency_ms_p50": _percentile(pooled, 0.5),
            "latency_ms_p95": _percentile(pooled, 0.95),
            "errors": sum(tally.errors for _, tally in done),
            "answered": sum(r["answered"] for r, _ in done),
            "per_client": [{**r, "errors": tally.errors} for r, tally in done],
        })
    return {"keystrokes_per_client": args.keystrokes, "interval_ms": args.interval_ms,
            "backend": runs[0]["per_client"][0]["backend"] if runs else None,
            "transport": "tcp" if getattr(args, "tcp", False) else "stdio", "runs": runs}


@contextlib.asynccontextmanager
async def _tcp_server(args: Any, server_command: list[str] | None = None):
    """A `serve --tcp` server on a free local port: yields (port, pid)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = (server_command or _server_command(args)) + ["--tcp", "--port", str(port)]
    proc = await asyncio.create_subprocess_exec(*cmd, stdin=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.PIPE)
    drain = asyncio.ensure_future(_drain(proc.stderr))
    try:
        for _ in range(600):
            try:
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                break
            except OSError:
                if proc.returncode is not None:
                    raise SystemExit("codespec-lsp bench server: the TCP server exited")
                await asyncio.sleep(0.1)
        yield port, proc.pid
    finally:
        if proc.returncode is None:
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
        drain.cancel()


# ------------------------------------------------------------------------------ soak


async def soak(client: _Client, keystrokes: int, interval_s: float, corpus: Path | None,
               documents: int, rss: Any, switch_every: int = SOAK_SWITCH_EVERY) -> dict:
    """Type into `documents` open files in turn, cancelling each request still pending at the
    next keystroke; then wait for every answer and compare the server's copy of each file."""
    sources = _typable(_documents(corpus))
    docs, refill = [], {}
    for i, (uri, text) in zip(range(documents), itertools.cycle(sources)):
        doc = _start_doc(f"{uri}#soak{i}", text)
        docs.append(doc)
        refill[doc.uri] = doc.rest
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=doc.uri, language_id="python", version=1,
                                                 text="\n".join(doc.lines))))
    futures: list[asyncio.Future] = []
    cancels = 0
    rss_samples = [round(rss(), 1)]
    start = time.perf_counter()
    for k in range(keystrokes):
        doc = docs[(k // switch_every) % len(docs)]
        if not doc.rest:
            doc.rest = refill[doc.uri]  # typed to the end: type the same text again
        await asyncio.sleep(max(0.0, start + k * interval_s - time.perf_counter()))
        if futures and not futures[-1].done():
            client.cancel_request(types.CancelParams(id=f"s{k - 1}"))
            cancels += 1
        _type_one(client, doc)
        futures.append(client.protocol.send_request_async(
            types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionParams(
                text_document=types.TextDocumentIdentifier(uri=doc.uri),
                position=types.Position(line=doc.line, character=doc.utf16_col()),
                context=types.InlineCompletionContext(
                    trigger_kind=types.InlineCompletionTriggerKind.Automatic)),
            msg_id=f"s{k}"))
        if (k + 1) % SOAK_RSS_EVERY == 0:
            rss_samples.append(round(rss(), 1))
    done, not_done = await asyncio.wait(futures, timeout=LAST_ANSWER_TIMEOUT_S) if futures \
        else (set(), set())
    outcomes = {"ok": 0, "cancelled": 0, "error": 0}
    for f in done:
        exc = f.exception() if not f.cancelled() else None
        kind = "ok" if exc is None and not f.cancelled() else \
            "cancelled" if getattr(exc, "code", None) == -32800 else "error"
        outcomes[kind] += 1
    for f in not_done:
        f.cancel()
    equal = 0
    for doc in docs:
        got = await client.protocol.send_request_async(
            "codespec/documentText", {"textDocument": {"uri": doc.uri}})
        equal += getattr(got, "text", None) == "\n".join(doc.lines)
    rss_samples.append(round(rss(), 1))
    return {"keystrokes": keystrokes, "documents": len(docs), "cancels_sent": cancels,
            "answered_with_result": outcomes["ok"], "answered_cancelled": outcomes["cancelled"],
            "answered_with_error": outcomes["error"], "unanswered": len(not_done),
            "documents_equal": equal, "rss_mb_samples": rss_samples,
            "rss_growth_mb": round(rss_samples[-1] - rss_samples[0], 1),
            "rss_growth_after_warmup_mb": round(rss_samples[-1] - rss_samples[1], 1)
            if len(rss_samples) > 2 else None}


async def run_soak(args: Any, server_command: list[str] | None = None) -> dict:
    """`bench server --soak`: the soak above against one server over stdio, then shutdown and
    exit; the JSON adds the server's exit status."""
    import psutil

    client = _Client()
    await client.start_io(*(server_command or _server_command(args)))
    drain = asyncio.ensure_future(_drain(client._server.stderr))
    try:
        st = await _initialize(client)
        proc = psutil.Process(client._server.pid)
        result = await soak(client, args.keystrokes, args.interval_ms / 1000,
                            getattr(args, "corpus", None), getattr(args, "documents", 5),
                            lambda: proc.memory_info().rss / 2**20)
        await client.shutdown_async(None)
        client.exit(None)
        code = await asyncio.wait_for(client._server.wait(), 30)
    finally:
        try:
            await asyncio.wait_for(client.stop(), 10)
        except Exception:
            if client._server is not None and client._server.returncode is None:
                client._server.kill()
        drain.cancel()
    return {**result, "interval_ms": args.interval_ms, "exit_code": code,
            "error_messages": len(client.errors), "backend": st.get("backend", "local")}


def _client_counts(spec: str) -> list[int]:
    counts = [int(x) for x in str(spec).split(",") if x.strip()]
    if not counts or min(counts) < 1:
        raise SystemExit("codespec-lsp bench server: --clients takes counts like 4 or 1,2,4")
    return counts


def run_server_bench(args: Any) -> int:
    if getattr(args, "soak", False):
        result = asyncio.run(run_soak(args))
    elif getattr(args, "clients", None):
        result = asyncio.run(run_clients(args, _client_counts(args.clients)))
    else:
        result = asyncio.run(run_bench(args))
    text = json.dumps(result, indent=2)
    if getattr(args, "json_path", None):
        Path(args.json_path).write_text(text + "\n")
    print(text)
    return 0
