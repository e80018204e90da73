"""server.py's module-level handlers called with plain objects, no client (the range of an
answer typed through an auto-closed opener)."""

from types import SimpleNamespace

from lsprotocol import types

from codespec_lsp.lsp import server
from codespec_lsp.lsp.scheduler import CompletionRequest, Outcome


class FakeScheduler:
    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome

    async def complete(self, req: CompletionRequest) -> Outcome:
        return self.outcome


def _ls(source: str, outcome: Outcome) -> SimpleNamespace:
    return SimpleNamespace(
        scheduler=FakeScheduler(outcome),
        request_for=lambda uri, pos: CompletionRequest(uri, source, pos.character))


async def test_an_answer_typed_over_a_closer_replaces_it():
    # `y = f(` typed through "f(a) or b", the editor's `)` right of the cursor.
    ls = _ls("y = f()", Outcome("a) or b", "typing_through", id="c1", replace=1))
    params = types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri="file:///a.py"),
        position=types.Position(line=0, character=6),
        context=types.InlineCompletionContext(
            trigger_kind=types.InlineCompletionTriggerKind.Automatic))
    (item,) = (await server.inline_completion(ls, params)).items
    assert item.insert_text == "a) or b"
    assert (item.range.start.character, item.range.end.character) == (6, 7)
    assert item.command.arguments == ["c1"]


async def test_a_plain_answer_is_inserted_at_the_cursor():
    ls = _ls("x = ", Outcome("value + 1", "answered", id="c2"))
    params = types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri="file:///a.py"),
        position=types.Position(line=0, character=4),
        context=types.InlineCompletionContext(
            trigger_kind=types.InlineCompletionTriggerKind.Invoked))
    (item,) = (await server.inline_completion(ls, params)).items
    assert item.range.start == item.range.end == params.position
