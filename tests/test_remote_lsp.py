"""`codespec-lsp serve --remote URL` over stdio against the fake OpenAI-compatible server:
suggestions come from the server, stats name the backend, an outage is told once and recovers
by itself, and settings switch the server without a restart."""

from __future__ import annotations

import asyncio
import sys

import pytest
from lsprotocol import types
from pygls.lsp.client import LanguageClient

from lsp_helpers import open_doc, stats, wait_loaded
from tests.fake_openai_server import FakeServer, FakeState

pytestmark = pytest.mark.asyncio

TINY_TARGET = "codespec_lsp/models/tiny/target"


class Client(LanguageClient):
    def __init__(self) -> None:
        super().__init__("codespec-remote-test", "1")
        self.shown: list[tuple[int, str]] = []

        @self.feature(types.WINDOW_SHOW_MESSAGE)
        def _show(params: types.ShowMessageParams) -> None:
            self.shown.append((params.type, params.message))

        @self.feature(types.WINDOW_LOG_MESSAGE)
        def _log(params: types.LogMessageParams) -> None:
            return None

    def errors(self) -> list[str]:
        return [m for t, m in self.shown if t == types.MessageType.Error]


async def start(*flags: str, options: dict | None = None) -> Client:
    client = Client()
    await client.start_io(sys.executable, "-m", "codespec_lsp.cli", "serve", *flags)
    caps = types.ClientCapabilities(text_document=types.TextDocumentClientCapabilities(
        inline_completion=types.InlineCompletionClientCapabilities()))
    await client.initialize_async(types.InitializeParams(
        capabilities=caps, initialization_options={"debounceMs": 0, "maxTokens": 16, **(options or {})}))
    client.initialized(types.InitializedParams())
    await wait_loaded(client, 60)
    return client


async def stop(client: Client) -> None:
    await client.shutdown_async(None)
    client.exit(None)
    await asyncio.wait_for(client.stop(), 10)


async def inline(client: Client, uri: str, line: int, col: int) -> str | None:
    result = await client.text_document_inline_completion_async(types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line, col),
        context=types.InlineCompletionContext(
            trigger_kind=types.InlineCompletionTriggerKind.Invoked)))
    items = result.items if isinstance(result, types.InlineCompletionList) else (result or [])
    return items[0].insert_text if items else None


def script_for(text: str) -> list[int]:
    from codespec_lsp.engine.models import load_tokenizer
    return load_tokenizer(TINY_TARGET).encode(text, add_special_tokens=False)


async def until(predicate, limit_s: float = 10.0) -> bool:
    for _ in range(int(limit_s / 0.05)):
        if await predicate():
            return True
        await asyncio.sleep(0.05)
    return False


async def test_suggestions_come_from_the_server_and_an_outage_is_told_once():
    # "    return" ends mid-word: its last token is backed up (token healing) and re-typed first.
    state = FakeState(script=script_for(" x + 1\n"), prefer=script_for("\n    return")[-1:])
    fake = FakeServer(state)
    client = await start("--remote", fake.url, "--target", TINY_TARGET)
    try:
        st = await stats(client)
        assert st["backend"] == "vllm" and st["state"] == "ready"
        assert "server_acceptance_rate" in st and "server_prefix_cache_hit_rate" in st
        uri = open_doc(client, "remote_a.py", "def f(x):\n    return")
        assert await inline(client, uri, 1, 10) == " x + 1"
        prompt = state.requests[-1]["body"]["prompt"]
        assert isinstance(prompt, list) and prompt[0] == 1  # ids, BOS first
        healing = state.requests[-2]["body"]  # " return" was re-typed under the constraint
        assert healing["stream"] is False and state.prefer[0] in healing["allowed_token_ids"]

        fake.stop()
        for col in (6, 7, 8):  # keystrokes while the server is down: empty answers, one message
            assert await inline(client, uri, 1, col) is None
        assert await until(lambda: asyncio.sleep(0, len(client.errors()) == 1))
        assert "refused" in client.errors()[0] or "reach" in client.errors()[0]

        fake = FakeServer(state, port=fake.port)
        answer = None
        for _ in range(100):  # the back-off is at most 8 s; recovery needs no user action
            answer = await inline(client, uri, 1, 9)
            if answer:
                break
            await asyncio.sleep(0.1)
        assert answer is not None
        assert any("answers again" in m for _, m in client.shown)
        assert len(client.errors()) == 1
    finally:
        await stop(client)
        fake.stop()


async def test_settings_switch_between_local_and_servers_without_a_restart():
    with FakeServer(FakeState(kind="vllm")) as one, FakeServer(FakeState(kind="llama-server")) as two:
        client = await start("--preset", "tiny", "--device", "cpu")
        try:
            assert (await stats(client))["backend"] == "local"
            for settings, backend in (({"remote": one.url}, "vllm"),
                                      ({"remote": two.url}, "llama-server"),
                                      ({"remote": None}, "local")):
                client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
                    settings={"codespec": settings}))
                assert await until(lambda: stats_backend(client, backend), 60), backend
            assert client.errors() == []
        finally:
            await stop(client)


async def stats_backend(client: Client, want: str) -> bool:
    st = await stats(client)
    return st["state"] == "ready" and st.get("backend") == want
