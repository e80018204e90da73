"""Client-side helpers shared by the end-to-end LSP tests."""

from __future__ import annotations

import asyncio

from lsprotocol import types


async def stats(client) -> dict:
    # pygls gives custom results to the client as namedtuples.
    return (await client.protocol.send_request_async("codespec/stats", None))._asdict()


async def counters(client) -> dict:
    return (await client.protocol.send_request_async("codespec/counters", None))._asdict()


async def wait_loaded(client, limit_s: float = 240) -> dict:
    """Stats once the server has left the loading state (ready or error)."""
    for _ in range(int(limit_s / 0.25)):
        st = await stats(client)
        if st["state"] != "loading":
            return st
        await asyncio.sleep(0.25)
    raise AssertionError("the server never left the loading state")


def open_doc(client, name: str, text: str, folder: str = "/tmp/codespec-e2e") -> str:
    uri = f"file://{folder}/{name}"
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))
    return uri
