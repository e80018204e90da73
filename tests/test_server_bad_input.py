"""Bad input over a real stdio server: each case gets a clear error or an empty answer, and the
server keeps serving. One server with the embedded pair for the module; the broken-folder and
mismatched-pair cases start their own (they fail while loading, which is cheap)."""

import asyncio
import concurrent.futures
from functools import partial
import json
import pathlib
import shutil
import sys

import pytest
import pytest_lsp
from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pytest_lsp import ClientServerConfig, LanguageClient

from codespec_lsp import TINY_DIR
from lsp_helpers import open_doc as _open_doc
from lsp_helpers import stats
from lsp_helpers import wait_loaded as wait_state

open_doc = partial(_open_doc, folder="/tmp/codespec-bad")

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

TINY = TINY_DIR
SERVE = [sys.executable, "-m", "codespec_lsp.cli", "serve", "--device", "cpu"]


@pytest_lsp.fixture(scope="module", config=ClientServerConfig(server_command=SERVE + [
    "--preset", "tiny"]))
async def client(lsp_client: LanguageClient):
    await lsp_client.initialize_session(types.InitializeParams(
        capabilities=types.ClientCapabilities(),
        initialization_options={"debounceMs": 0, "maxTokens": 16}))
    await wait_state(lsp_client)
    yield
    await lsp_client.shutdown_session()


def inline(client, uri: str, line: int, char: int):
    return client.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=types.Position(line=line, character=char),
        context=types.InlineCompletionContext(
            trigger_kind=types.InlineCompletionTriggerKind.Invoked)))


def write_raw(client, body: bytes) -> None:
    client.protocol.writer.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)


async def raw_request(client, msg_id, body: bytes):
    """Send bytes as they are and wait for the answer to `msg_id` (None: an id-less error)."""
    fut: concurrent.futures.Future = concurrent.futures.Future()
    client.protocol._request_futures[msg_id] = fut
    write_raw(client, body)
    return await asyncio.wait_for(asyncio.wrap_future(fut), 30)


async def still_serving(client) -> None:
    st = await stats(client)
    assert st["state"] == "ready"


async def test_position_past_end_of_document_and_line(client: LanguageClient):
    uri = open_doc(client, "short.py", "x = 1\ny = 2\n")
    assert not (await inline(client, uri, 50, 0)).items
    assert not (await inline(client, uri, 0, 99)).items
    # The empty line after the final newline is a real place, not past the end.
    assert isinstance(await inline(client, uri, 2, 0), types.InlineCompletionList)
    await still_serving(client)


async def test_unknown_document_is_a_clear_error(client: LanguageClient):
    with pytest.raises(JsonRpcInvalidParams) as err:
        await inline(client, "file:///never/opened.py", 0, 0)
    assert "didOpen" in str(err.value.message)
    await still_serving(client)


async def test_malformed_params_get_invalid_params(client: LanguageClient):
    body = json.dumps({"jsonrpc": "2.0", "id": "bad-1", "method": "textDocument/inlineCompletion",
                       "params": {"textDocument": {"uri": 5}, "position": "here"}}).encode()
    with pytest.raises(JsonRpcInvalidParams) as err:
        await raw_request(client, "bad-1", body)
    assert "textDocument/inlineCompletion" in str(err.value.message)
    await still_serving(client)


async def test_non_json_message_gets_parse_error(client: LanguageClient):
    with pytest.raises(JsonRpcException) as err:
        await raw_request(client, None, b"{this is not json")
    assert err.value.code == types.ErrorCodes.ParseError
    await still_serving(client)


async def test_megabyte_document(client: LanguageClient):
    line = "value_{0} = compute(value_{0}, 'text')  # 日本\n"
    text = "".join(line.format(i) for i in range(25_000))
    assert len(text.encode()) > 1_000_000
    uri = open_doc(client, "huge.py", text)
    last = text.count("\n")
    res = await inline(client, uri, last, 0)
    assert isinstance(res, types.InlineCompletionList)
    # Incremental edit in the middle, then a request there.
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(line=12_000, character=0),
                              end=types.Position(line=12_000, character=0)),
            text="def f(x):\n    ")]))
    res = await inline(client, uri, 12_001, 4)
    assert isinstance(res, types.InlineCompletionList)
    await still_serving(client)


# ------------------------------------------------------------------ broken models


async def _start_failing(target: pathlib.Path, draft: pathlib.Path):
    client = await ClientServerConfig(server_command=SERVE + [
        "--target", str(target), "--draft", str(draft)]).start()
    await client.initialize_session(types.InitializeParams(
        capabilities=types.ClientCapabilities(
            window=types.WindowClientCapabilities(work_done_progress=True))))
    return client


async def _assert_failed_but_serving(client, expect: str) -> None:
    st = await wait_state(client)
    assert st["state"] == "error"
    errors = [m.message for m in client.messages if m.type == types.MessageType.Error]
    assert errors and expect in errors[0].lower(), errors
    uri = open_doc(client, "a.py", "def f():\n    ")
    assert not (await inline(client, uri, 1, 4)).items  # empty, at once, no hang
    assert (await stats(client))["requests"] == 1
    await client.shutdown_session()
    await client.stop()


@pytest.mark.asyncio(loop_scope="function")
async def test_broken_model_folder(tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(TINY / "target", broken)
    (broken / "model.safetensors").write_bytes(b"\x00garbage, not a safetensors file" * 64)
    client = await _start_failing(broken, broken)
    await _assert_failed_but_serving(client, str(broken).lower())


@pytest.mark.asyncio(loop_scope="function")
async def test_mismatched_pair(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    other = tmp_path / "other-family"
    shutil.copytree(TINY / "draft", other)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.train_from_iterator(["def parse(path):\n    return open(path).read()\n"] * 20,
                            trainers.BpeTrainer(vocab_size=300,
                                                special_tokens=["<unk>", "<s>", "</s>"]))
    tok.save(str(other / "tokenizer.json"))
    client = await _start_failing(TINY / "target", other)
    await _assert_failed_but_serving(client, "cannot speculate")
