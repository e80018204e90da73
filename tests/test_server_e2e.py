"""End to end over a real stdio subprocess, the embedded model pair, pytest-lsp as the client.

One server for the module (loading the models is the slow part); each test opens its own
document so they do not depend on each other's order beyond "the models are loaded".
"""

import asyncio
import importlib.util
import os
import pathlib
import socket
import subprocess
import sys

import pytest
import psutil
import pytest_lsp
from lsprotocol import types
from pygls.lsp.client import LanguageClient as PyglsClient
from pygls.exceptions import JsonRpcRequestCancelled
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from lsp_helpers import counters, open_doc, stats
from lsp_helpers import wait_loaded as wait_ready

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

STATS_FIELDS = {
    "requests", "answered", "cancelled", "superseded", "typing_through_hits",
    "cache_reused_tokens", "prefill_tokens", "acceptance_rate", "tokens_per_target_forward",
    "latency_ms_p50", "latency_ms_p95", "draft", "target", "device", "state", "preset",
    "backend", "server_acceptance_rate", "server_prefix_cache_hit_rate",
}
PY = """import os
import sys


def read_lines(path):
    with open(path) as f:
        return f.readlines()


def main():
    for name in sys.argv[1:]:
        lines = read_lines(name)
        print(len(lines))


"""


def inline_capable(caps: types.ClientCapabilities) -> types.ClientCapabilities:
    """VS Code's recorded capabilities predate LSP 3.18: add what VS Code ≥ 1.85 sends."""
    caps.text_document.inline_completion = types.InlineCompletionClientCapabilities()
    return caps


@pytest_lsp.fixture(
    scope="module",
    config=ClientServerConfig(server_command=[
        sys.executable, "-m", "codespec_lsp.cli", "serve", "--preset", "tiny", "--device", "cpu",
    ]),
)
async def client(lsp_client: LanguageClient):
    result = await lsp_client.initialize_session(types.InitializeParams(
        capabilities=inline_capable(client_capabilities("visual_studio_code")),
        initialization_options={"debounceMs": 0, "maxTokens": 24},
    ))
    lsp_client.init_result = result
    await wait_ready(lsp_client)
    yield
    await lsp_client.shutdown_session()


def insert(client, uri: str, version: int, line: int, char: int, text: str) -> None:
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(line=line, character=char),
                              end=types.Position(line=line, character=char)),
            text=text)]))


def inline(client, uri: str, line: int, char: int, msg_id=None):
    params = types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=types.Position(line=line, character=char),
        context=types.InlineCompletionContext(
            trigger_kind=types.InlineCompletionTriggerKind.Automatic))
    # Sent now, not when awaited (pytest-lsp's send_request_async sends only then): the tests
    # that cancel or supersede depend on the order the server sees.
    return asyncio.wrap_future(client.protocol.send_request(
        types.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id=msg_id))


async def test_initialize_advertises_inline_completion(client: LanguageClient):
    caps = client.init_result.capabilities
    assert caps.inline_completion_provider is not None
    assert caps.position_encoding == types.PositionEncodingKind.Utf16
    assert caps.text_document_sync.change == types.TextDocumentSyncKind.Incremental
    assert "codespec.didAcceptCompletion" in caps.execute_command_provider.commands
    # An editor with inline completion is not also offered the popup fallback.
    assert caps.completion_provider is None


async def test_models_loaded_with_progress(client: LanguageClient):
    st = await stats(client)
    assert st["state"] == "ready" and "tiny" in st["target"] and st["device"] == "cpu"
    # "ready" comes first; the progress end follows once the pair's plan is checked.
    for _ in range(120):
        kinds = [type(v).__name__ for reports in client.progress_reports.values() for v in reports]
        if kinds and kinds[-1] == "WorkDoneProgressEnd":
            break
        await asyncio.sleep(0.25)
    assert kinds[0] == "WorkDoneProgressBegin" and kinds[-1] == "WorkDoneProgressEnd"


async def test_open_type_and_complete(client: LanguageClient):
    text = PY + "def count_words(text):\n    "
    uri = open_doc(client, "a.py", PY)
    insert(client, uri, 2, PY.count("\n"), 0, "def count_words(text):\n    ")
    line = text.count("\n")
    res = await inline(client, uri, line, 4)
    assert len(res.items) == 1
    item = res.items[0]
    assert item.insert_text.strip()
    assert item.range.start == types.Position(line=line, character=4) == item.range.end
    assert item.command.command == "codespec.didAcceptCompletion"
    # An answer the time budget showed early is counted when its generation ends (a busy
    # machine): the prompt's tokens arrive then.
    for _ in range(120):
        st = await stats(client)
        if st["prefill_tokens"] > 0:
            break
        await asyncio.sleep(0.25)
    assert st["answered"] >= 1 and st["prefill_tokens"] > 0


async def test_typing_through_answers_from_memory(client: LanguageClient):
    uri = open_doc(client, "b.py", PY + "def parse(path):\n    ")
    line = (PY + "def parse(path):\n    ").count("\n")
    first = (await inline(client, uri, line, 4)).items
    assert first, "the model had nothing to say here"
    suggestion = first[0].insert_text
    before = await stats(client)
    insert(client, uri, 2, line, 4, suggestion[0])
    rest = (await inline(client, uri, line, 5)).items
    after = await stats(client)
    assert rest and rest[0].insert_text == suggestion[1:]
    assert after["typing_through_hits"] == before["typing_through_hits"] + 1
    assert after["prefill_tokens"] == before["prefill_tokens"]  # no model call at all


async def test_with_an_item_selected_the_answer_is_for_the_text_with_the_item_in_place(
        client: LanguageClient):
    # VS Code's suggest widget has `read_lines` selected while the user has typed `read_li`:
    # the answer replaces `read_li` and starts with `read_lines`, and the server gives it again
    # once `nes` is typed (from memory: the request was for that text).
    base = PY + "def count(name):\n    lines = read_li"
    uri = open_doc(client, "sel.py", base)
    line, end = base.count("\n"), len(base.rsplit("\n", 1)[-1])
    params = types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=types.Position(line=line, character=end),
        context=types.InlineCompletionContext(
            trigger_kind=types.InlineCompletionTriggerKind.Automatic,
            selected_completion_info=types.SelectedCompletionInfo(
                range=types.Range(start=types.Position(line=line, character=end - 7),
                                  end=types.Position(line=line, character=end)),
                text="read_lines")))
    (item,) = (await client.text_document_inline_completion_async(params)).items
    assert item.insert_text.startswith("read_lines") and len(item.insert_text) > len("read_lines")
    assert item.range.start.character == end - 7 and item.range.end.character == end
    insert(client, uri, 2, line, end, "nes")
    (typed,) = (await inline(client, uri, line, end + 3)).items
    # (an answer the time budget showed early grows in memory when its generation ends)
    assert ("read_lines" + typed.insert_text).startswith(item.insert_text)


async def test_supersede_by_typing(client: LanguageClient):
    base = PY + "def total(values):\n    "
    uri = open_doc(client, "c.py", base)
    line = base.count("\n")
    before = await stats(client)
    older = inline(client, uri, line, 4)
    insert(client, uri, 2, line, 4, "r")
    newer = inline(client, uri, line, 5)
    old_res, new_res = await asyncio.gather(older, newer)
    after = await stats(client)
    # The older request, still generating when the newer came, answered empty; the newer one
    # was answered normally.
    assert not old_res.items
    assert after["superseded"] == before["superseded"] + 1
    assert after["answered"] == before["answered"] + 1
    assert isinstance(new_res, types.InlineCompletionList)


async def test_cancel_request_is_counted_once_and_the_engine_goes_on(client: LanguageClient):
    """The real pair may end this generation before the cancel arrives (the block ends): either
    way the request is counted exactly once, as the client saw it, and the next request after
    a cancelled generation is answered. How fast a cancel stops the engine is tested on the fake
    engine below, where the generation surely outlasts the cancel."""
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"codespec": {"maxTokens": 400, "debounceMs": 0}}))
    uri = open_doc(client, "d.py", PY + "class Parser:\n    ")
    line = (PY + "class Parser:\n    ").count("\n")
    before = await stats(client)
    fut = inline(client, uri, line, 4, msg_id="cancel-me")
    await asyncio.sleep(0.3)
    client.cancel_request(types.CancelParams(id="cancel-me"))
    try:
        seen = "answered" if isinstance(await fut, types.InlineCompletionList) else "?"
    except JsonRpcRequestCancelled:
        seen = "cancelled"
    after = await stats(client)
    counted = {k: after[k] - before[k] for k in ("answered", "cancelled", "superseded")}
    assert counted == {"answered": int(seen == "answered"), "cancelled": int(seen == "cancelled"),
                       "superseded": 0}
    # Without workspace context: the documents this module's earlier tests edited would join
    # the prompt (edited spans), and there the 6 M tiny pair ends this block at once (3 tokens,
    # nothing to show). This is about the engine after a cancel, not about context.
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"codespec": {"maxTokens": 24, "debounceMs": 0, "workspaceContext": False}}))
    other = open_doc(client, "d2.py", PY + "def count_words(text):\n    ")
    assert (await inline(client, other, PY.count("\n") + 1, 4)).items
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"codespec": {"maxTokens": 24, "debounceMs": 0}}))


async def test_fallback_completion(client: LanguageClient):
    text = PY + "def helper(items):\n    return sor"
    uri = open_doc(client, "e.py", text)
    line = text.count("\n")
    res = await client.text_document_completion_async(types.CompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=types.Position(line=line, character=14)))
    assert isinstance(res, types.CompletionList) and res.is_incomplete
    # Greedy on the embedded pair is deterministic: it has something to say here.
    assert len(res.items) == 1
    item = res.items[0]
    # The item replaces the word before the cursor, so the client's filter keeps it.
    assert item.text_edit.range.start.character == 11
    assert item.text_edit.new_text.startswith("sor") and item.filter_text.startswith("sor")


async def test_configuration_change_disables_and_enables(client: LanguageClient):
    uri = open_doc(client, "f.py", PY + "def run():\n    ")
    line = (PY + "def run():\n    ").count("\n")
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"codespec": {"enable": False}}))
    assert not (await inline(client, uri, line, 4)).items
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"codespec": {"enable": True, "maxTokens": 24, "debounceMs": 0}}))
    assert isinstance(await inline(client, uri, line, 4), types.InlineCompletionList)


async def test_invalid_setting_is_shown_and_ignored(client: LanguageClient):
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"codespec": {"maxTokens": "many", "debounceMs": 0}}))
    await stats(client)  # a round trip: the notification has been handled
    assert any("maxTokens" in m.message for m in client.messages)
    assert (await stats(client))["state"] == "ready"


async def test_pulled_settings_apply_after_the_round_trip(client: LanguageClient):
    """A client that sends an empty didChangeConfiguration (the pull model, VS Code's) is asked
    with workspace/configuration; what it answers is applied, an invalid value shown."""
    client.set_configuration({"maxTokens": "lots", "debounceMs": 0}, section="codespec")
    seen = len(client.messages)
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=None))
    for _ in range(100):  # the server's request and its showMessage take a round trip or two
        if any("maxTokens" in m.message for m in client.messages[seen:]):
            break
        await asyncio.sleep(0.05)
    assert any("maxTokens" in m.message and "lots" in m.message for m in client.messages[seen:])
    client.set_configuration({"maxTokens": 24, "debounceMs": 0}, section="codespec")
    assert (await stats(client))["state"] == "ready"


async def test_stats_fields_exactly(client: LanguageClient):
    st = await stats(client)
    assert set(st) == STATS_FIELDS
    assert st["requests"] >= st["answered"] > 0
    assert 0.0 <= st["acceptance_rate"] <= 1.0
    assert st["latency_ms_p95"] >= st["latency_ms_p50"] >= 0


# -------------------------------------------------------- capability variants (fake engine)

FAKE = [sys.executable, str(pathlib.Path(__file__).with_name("fake_engine.py"))]


@pytest_lsp.fixture(scope="module", config=ClientServerConfig(server_command=FAKE))
async def neovim(lsp_client: LanguageClient):
    lsp_client.init_result = await lsp_client.initialize_session(types.InitializeParams(
        capabilities=client_capabilities("neovim"),
        initialization_options={"debounceMs": 0}))
    await wait_ready(lsp_client)
    yield
    await lsp_client.shutdown_session()


async def test_client_without_inline_gets_completion_fallback(neovim: LanguageClient):
    caps = neovim.init_result.capabilities
    assert caps.completion_provider is not None and caps.inline_completion_provider is not None
    uri = open_doc(neovim, "n.py", "x = val")
    res = await neovim.text_document_completion_async(types.CompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=types.Position(line=0, character=7)))
    assert len(res.items) == 1
    item = res.items[0]
    assert item.text_edit.new_text == "valvalue + 1"  # the fake engine's scripted suggestion
    assert item.text_edit.range.start.character == 4


async def test_position_encoding_negotiation(neovim: LanguageClient):
    # Neovim offers utf-8/utf-16/utf-32; pygls picks the client's first preference it knows.
    offered = neovim.capabilities.general.position_encodings
    assert neovim.init_result.capabilities.position_encoding == offered[0]


async def test_accept_events_feed_counters(neovim: LanguageClient):
    client = neovim  # the fake engine: its answer here is scripted, never empty
    uri = open_doc(client, "h.py", "x = ")
    res = await inline(client, uri, 0, 4)
    assert len(res.items) == 1
    item = res.items[0]
    c0 = await counters(client)
    client.protocol.notify("codespec/didShowCompletion", {"item": client.protocol._converter
                                                          .unstructure(item)})
    client.protocol.notify("codespec/didPartiallyAcceptCompletion",
                           {"id": item.command.arguments[0], "acceptedLength": 1})
    await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command=item.command.command, arguments=item.command.arguments))
    c1 = await counters(client)
    assert c1["shown"] == c0["shown"] + 1
    assert c1["partially_accepted"] == c0["partially_accepted"] + 1
    assert c1["accepted"] == c0["accepted"] + 1


async def test_cancel_request_stops_the_engine_within_a_forward():
    """A cancelled generation stops at the next forward (it is counted cancelled and its
    forwards wasted), and the engine answers the next request. The fake engine takes 50 ms a
    forward for 100+ forwards here, so the cancel surely lands mid-generation."""
    client = await ClientServerConfig(server_command=FAKE, server_env={
        **os.environ, "FAKE_FORWARD_S": "0.05"}).start()
    # No time budget: the request must still be generating when the cancel comes.
    await client.initialize_session(types.InitializeParams(
        capabilities=types.ClientCapabilities(),
        initialization_options={"debounceMs": 0, "maxTokens": 400, "timeBudgetMs": 0}))
    await wait_ready(client)
    uri = open_doc(client, "long.py", "long = ")  # the fake engine's 300-term continuation
    before, c0 = await stats(client), await counters(client)
    fut = inline(client, uri, 0, 7, msg_id="cancel-me")
    await asyncio.sleep(0.5)
    client.cancel_request(types.CancelParams(id="cancel-me"))
    with pytest.raises(JsonRpcRequestCancelled):
        await fut
    # The engine worker is one FIFO thread: once this is answered, the cancelled generation
    # has ended and been accounted.
    assert (await inline(client, open_doc(client, "next.py", "x = "), 0, 4)).items
    after, c1 = await stats(client), await counters(client)
    assert after["cancelled"] == before["cancelled"] + 1
    wasted = c1["wasted_target_forwards"] - c0["wasted_target_forwards"]
    spent = c1["target_forwards"] - c0["target_forwards"]
    # Forwards ran before the cancel (0.5 s), all wasted, and far fewer than the 100+ a full
    # answer takes; the next answer's own few forwards are used.
    assert 1 <= wasted < 60 and 0 < spent - wasted < 10
    # Cancelled at once, as editors do while typing: the server may read both messages together
    # and cancel the handler before it ever ran; counted all the same.
    fut = inline(client, uri, 0, 7, msg_id="cancel-at-once")
    client.cancel_request(types.CancelParams(id="cancel-at-once"))
    with pytest.raises(JsonRpcRequestCancelled):
        await fut
    st = await stats(client)
    assert (st["requests"], st["cancelled"]) == (after["requests"] + 1, after["cancelled"] + 1)
    await client.shutdown_session()
    await client.stop()


async def test_debug_log_has_one_line_per_request(tmp_path):
    """Issue 12 (Neovim item 6): with --log-level debug the server logs each request's id,
    document, position, outcome, tokens and time, so a client's log can be matched to it."""
    log_file = tmp_path / "server.log"
    client = await ClientServerConfig(server_command=FAKE + [
        "--log-level", "debug", "--log-file", str(log_file)]).start()
    await client.initialize_session(types.InitializeParams(
        capabilities=types.ClientCapabilities(), initialization_options={"debounceMs": 0}))
    await wait_ready(client)
    uri = open_doc(client, "dbg.py", "x = ")
    first = await inline(client, uri, 0, 4, msg_id="req-1")
    await inline(client, uri, 0, 4, msg_id="req-2")
    await client.shutdown_session()
    await client.stop()
    lines = [ln for ln in log_file.read_text().splitlines() if " request id=" in ln]
    assert len(lines) == 2
    assert f"request id=req-1 {uri} 0:4 outcome=answered tokens=" in lines[0]
    assert first.items and "tokens=0 " not in lines[0] and " ms=" in lines[0]
    assert f"request id=req-2 {uri} 0:4 outcome=repeat tokens=0 ms=" in lines[1]


async def test_invalid_command_line_setting_is_shown_not_only_logged():
    """Issue 13 item 16: `--dtype float64` was only logged; the user never saw it."""
    client = await ClientServerConfig(server_command=FAKE + ["--dtype", "float64"]).start()
    await client.initialize_session(types.InitializeParams(capabilities=types.ClientCapabilities()))
    assert (await wait_ready(client))["state"] == "ready"  # served on with the default dtype
    shown = [m for m in client.messages if "dtype" in m.message]
    assert len(shown) == 1 and shown[0].type == types.MessageType.Error
    assert "float64" in shown[0].message and "float16, bfloat16, float32" in shown[0].message
    await client.shutdown_session()
    await client.stop()


async def test_nan_weights_are_reported_as_a_load_error():
    """Issue 13 item 16: a model whose first forward gives NaN loaded as "ready" and answered
    empty forever."""
    client = await ClientServerConfig(server_command=FAKE + ["--target", "nan"]).start()
    await client.initialize_session(types.InitializeParams(capabilities=types.ClientCapabilities()))
    st = await wait_ready(client)
    assert st["state"] == "error" and "NaN" in (await counters(client))["error"]
    assert any("NaN" in m.message and m.type == types.MessageType.Error for m in client.messages)
    await client.shutdown_session()
    await client.stop()


async def test_non_ascii_positions_are_utf16():
    """On the fake engine, whose answer is scripted: the position mapping is what is tested,
    not whether the model has something to say."""
    client = await ClientServerConfig(server_command=FAKE).start()
    result = await client.initialize_session(types.InitializeParams(
        capabilities=types.ClientCapabilities(), initialization_options={"debounceMs": 0}))
    assert result.capabilities.position_encoding in (None, types.PositionEncodingKind.Utf16)
    await wait_ready(client)
    # "😀" is 2 UTF-16 units, "日本" 1 each: the cursor after `x = ` is at UTF-16 column 23
    # (22 code points).
    text = PY + "greeting = '日本😀'; x = \n"
    uri = open_doc(client, "g.py", text)
    line = PY.count("\n")
    col = len("greeting = '日本") + 2 + len("'; x = ")
    res = await inline(client, uri, line, col)
    assert [i.insert_text for i in res.items] == ["value + 1"]
    assert res.items[0].range.start == types.Position(line=line, character=col)
    # Past the end of that line in UTF-16 units (one beyond): empty, not an error.
    assert not (await inline(client, uri, line, col + 1)).items
    await client.shutdown_session()
    await client.stop()


async def test_a_completion_cancelled_before_its_handler_ran_is_counted():
    """Request and cancel in one read (editors cancel the previous request as they type): pygls
    cancels the handler before it starts, so the scheduler never saw it and the outcomes no
    longer added up to the requests (bench server: 38 of 40)."""
    import json

    from raw_lsp import RawServer

    server = RawServer()
    try:
        server.initialize()
        server.open("file:///c.py", "x = ")

        def framed(msg: dict) -> bytes:
            body = json.dumps(msg).encode()
            return b"Content-Length: %d\r\n\r\n" % len(body) + body

        server.write(framed({"jsonrpc": "2.0", "id": "c1", "method": "textDocument/inlineCompletion",
                             "params": {"textDocument": {"uri": "file:///c.py"},
                                        "position": {"line": 0, "character": 4},
                                        "context": {"triggerKind": 2}}})
                     + framed({"jsonrpc": "2.0", "method": "$/cancelRequest",
                               "params": {"id": "c1"}}))
        assert server.response("c1")["error"]["code"] == -32800  # RequestCancelled
        st = server.request("s", "codespec/stats")["result"]
        assert (st["requests"], st["cancelled"]) == (1, 1)
    finally:
        server.close()


async def test_shutdown_and_exit_end_the_process():
    client = await ClientServerConfig(server_command=FAKE).start()
    await client.initialize_session(types.InitializeParams(capabilities=types.ClientCapabilities()))
    await client.shutdown_session()
    assert client._server.returncode == 0
    await client.stop()


async def test_no_arguments_speaks_lsp_on_stdio():
    client = await ClientServerConfig(
        server_command=[sys.executable, "-m", "codespec_lsp.cli"]).start()
    result = await client.initialize_session(types.InitializeParams(
        capabilities=types.ClientCapabilities()))
    assert result.server_info.name == "codespec-lsp"
    # Shutting down while the models may still be loading must not hang.
    await client.shutdown_session()
    assert client._server.returncode == 0
    await client.stop()


async def test_requests_while_loading_answer_empty_at_once():
    client = await ClientServerConfig(server_command=FAKE, server_env={
        **os.environ, "FAKE_LOAD_S": "30"}).start()
    await client.initialize_session(types.InitializeParams(capabilities=types.ClientCapabilities(
        window=types.WindowClientCapabilities(work_done_progress=True))))
    uri = open_doc(client, "l.py", "x = ")
    res = await asyncio.wait_for(inline(client, uri, 0, 4), 5)  # no hang behind the load
    assert not res.items
    assert (await stats(client))["state"] == "loading"
    await client.shutdown_session()  # while the (fake) load still runs
    assert client._server.returncode == 0
    await client.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_tcp_listens_on_localhost_by_default():
    port = _free_port()
    proc = subprocess.Popen(FAKE + ["--tcp", "--port", str(port)], stderr=subprocess.DEVNULL)
    try:
        client = PyglsClient("t", "1")
        for _ in range(100):
            try:
                await client.start_tcp("127.0.0.1", port)
                break
            except OSError:
                await asyncio.sleep(0.1)
        result = await client.initialize_async(types.InitializeParams(
            capabilities=types.ClientCapabilities()))
        assert result.capabilities.inline_completion_provider is not None
        listening = [c.laddr for c in psutil.Process(proc.pid).net_connections()
                     if c.status == psutil.CONN_LISTEN]
        assert listening and all(addr.ip == "127.0.0.1" for addr in listening)
        await client.shutdown_async(None)
        client.exit(None)
        await client.stop()
    finally:
        proc.kill()
        proc.wait()


async def test_ws_listens_on_localhost_and_answers_initialize():
    import json

    from websockets.asyncio.client import connect

    port = _free_port()
    proc = subprocess.Popen(FAKE + ["--ws", "--port", str(port)], stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                ws = await connect(f"ws://127.0.0.1:{port}")
                break
            except OSError:
                await asyncio.sleep(0.1)
        async with ws:
            await ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                      "params": {"processId": None, "rootUri": None,
                                                 "capabilities": {}}}))
            reply = json.loads(await asyncio.wait_for(ws.recv(), 30))
            # While connected: pygls may stop listening once its one client has gone.
            listening = [c.laddr for c in psutil.Process(proc.pid).net_connections()
                         if c.status == psutil.CONN_LISTEN]
        assert reply["id"] == 1 and "inlineCompletionProvider" in reply["result"]["capabilities"]
        assert listening and all(addr.ip == "127.0.0.1" for addr in listening)
    finally:
        proc.kill()
        proc.wait()


async def test_model_change_reloads_in_background():
    client = await ClientServerConfig(server_command=FAKE).start()
    await client.initialize_session(types.InitializeParams(capabilities=types.ClientCapabilities(
        window=types.WindowClientCapabilities(work_done_progress=True))))
    assert (await wait_ready(client))["state"] == "ready"
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"codespec": {"target": "broken"}}))
    st = await wait_state_not(client, "ready")
    st = await wait_state_not(client, "loading")
    assert st["state"] == "error"
    assert any("broken" in m.message and m.type == types.MessageType.Error
               for m in client.messages)
    uri = open_doc(client, "r.py", "x = ")
    assert not (await inline(client, uri, 0, 4)).items  # still serving, empty
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"codespec": {"target": None}}))
    assert (await wait_state_not(client, "error"))["state"] in ("loading", "ready")
    assert (await wait_ready(client))["state"] == "ready"
    assert (await inline(client, uri, 0, 4)).items
    # One begin/end pair per load: start, broken, back again.
    begins = [v for r in client.progress_reports.values() for v in r
              if isinstance(v, types.WorkDoneProgressBegin)]
    assert len(begins) == 3
    await client.shutdown_session()
    await client.stop()


async def wait_state_not(client, state: str, limit_s: float = 30) -> dict:
    for _ in range(int(limit_s / 0.05)):
        st = await stats(client)
        if st["state"] != state:
            return st
        await asyncio.sleep(0.05)
    raise AssertionError(f"still {state}")


BENCH_FIELDS = {
    "keystrokes", "answered", "cancelled", "superseded", "typing_through_hits",
    "latency_ms_p50", "latency_ms_p95", "wasted_forward_share", "rss_mb_start", "rss_mb_end",
    "last_keystroke_answered", "backend",
}


async def test_bench_server_replays_typing_and_reports_exact_fields(tmp_path):
    import argparse

    from codespec_lsp.bench.server import run_bench

    (tmp_path / "a.py").write_text("def f(x):\n    return x + 1\n\n\nprint(f(2))\n" * 5)
    args = argparse.Namespace(keystrokes=40, interval_ms=20, corpus=str(tmp_path))
    env_cmd = FAKE + ["--debounce-ms", "0"]
    out = await run_bench(args, server_command=env_cmd)
    assert set(out) == BENCH_FIELDS
    assert out["keystrokes"] == 40 and out["last_keystroke_answered"] is True
    # Every keystroke's request ends up counted one way or another by the server.
    assert out["answered"] + out["cancelled"] + out["superseded"] == 40
    assert 0.0 <= out["wasted_forward_share"] <= 1.0
    assert out["rss_mb_start"] > 0 and out["rss_mb_end"] > 0
