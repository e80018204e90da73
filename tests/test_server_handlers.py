"""server.py's module-level handlers called with plain objects, no client (the range of an
answer typed through an auto-closed opener, an answer after the suggest widget's item)."""

from types import SimpleNamespace

import pytest
from lsprotocol import types

from codespec_lsp.lsp import server
from codespec_lsp.lsp.scheduler import CompletionRequest, Outcome


class FakeScheduler:
    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome

    async def complete(self, req: CompletionRequest) -> Outcome:
        return self.outcome


def _ls(source: str, outcome: Outcome) -> SimpleNamespace:
    ls = SimpleNamespace(scheduler=FakeScheduler(outcome), selected=[])

    def request_for(uri, pos, selected=None):
        ls.selected.append(selected)
        return CompletionRequest(uri, source, pos.character)
    ls.request_for = request_for
    return ls


def _at(line: int, character: int) -> types.Position:
    return types.Position(line=line, character=character)


def _with_item(character: int, start: int, end: int, text: str, line: int = 0):
    return types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri="file:///a.py"),
        position=_at(0, character),
        context=types.InlineCompletionContext(
            trigger_kind=types.InlineCompletionTriggerKind.Automatic,
            selected_completion_info=types.SelectedCompletionInfo(
                range=types.Range(start=_at(line, start), end=_at(line, end)), text=text)))


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


async def test_with_the_suggest_widget_open_the_answer_follows_its_item():
    # `os.pa` with `path` selected: VS Code shows only an answer that replaces `pa` and starts
    # with `path`; the request is for the text with `path` in place (request_for gets the item).
    ls = _ls("os.path", Outcome(".join(root, name)", "answered", id="c3"))
    params = _with_item(5, 3, 5, "path")
    (item,) = (await server.inline_completion(ls, params)).items
    assert item.insert_text == "path.join(root, name)"
    assert (item.range.start, item.range.end) == (_at(0, 3), _at(0, 5))
    assert ls.selected == [params.context.selected_completion_info]


@pytest.mark.parametrize("params", [
    _with_item(5, 3, 5, "path", line=1),          # the item's range is not on the cursor's line
    _with_item(5, 0, 2, "os"),                     # nor around the cursor
    _with_item(5, 3, 5, "print(${1:value})"),      # a snippet: its fields would be typed as read
    _with_item(5, 3, 5, "path\nmore"),
])
async def test_an_item_the_answer_cannot_follow_is_left_out(params):
    ls = _ls("os.pa", Outcome("th", "answered", id="c4"))
    (item,) = (await server.inline_completion(ls, params)).items
    assert ls.selected == [None]
    assert item.insert_text == "th" and item.range.start == item.range.end == _at(0, 5)
