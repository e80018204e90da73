"""The server's copy of a document equals the editor's (issue 13, items 1-5): LSP line breaks,
positions past the end, reversed ranges, stale versions, text bound for the tokenizer."""

import pytest
from lsprotocol import types
from pygls.workspace import PositionCodec

from codespec_lsp.documents import Document, Workspace, clean

URI = "file:///p.py"


def pos(line: int, character: int) -> types.Position:
    return types.Position(line=line, character=character)


def workspace(text: str, version: int = 1) -> Workspace:
    ws = Workspace(None, types.TextDocumentSyncKind.Incremental)
    ws.put_text_document(types.TextDocumentItem(uri=URI, language_id="python", version=version,
                                                text=text))
    return ws


def edit(ws: Workspace, version: int, start: tuple[int, int], end: tuple[int, int], text: str):
    ws.update_text_document(
        types.VersionedTextDocumentIdentifier(uri=URI, version=version),
        types.TextDocumentContentChangePartial(
            range=types.Range(start=pos(*start), end=pos(*end)), text=text))


@pytest.mark.parametrize("encoding,col", [
    (types.PositionEncodingKind.Utf16, 23),
    (types.PositionEncodingKind.Utf8, len("greeting = '日本😀'; x = ".encode())),
    (types.PositionEncodingKind.Utf32, 22),
])
def test_offset_in_each_encoding(encoding, col):
    text = "import os\ngreeting = '日本😀'; x = \nz"
    doc = Document(URI, text, position_codec=PositionCodec(encoding))
    off = doc.offset_at(pos(1, col), strict=True)
    assert text[:off].endswith("; x = ") and text[off] == "\n"
    assert doc.offset_at(pos(1, col + 1), strict=True) is None
    assert doc.offset_at(pos(3, 0), strict=True) is None
    assert doc.offset_at(pos(2, 1), strict=True) == len(text)


def test_offset_on_the_line_after_a_final_newline():
    assert Document(URI, "x\n").offset_at(pos(1, 0), strict=True) == 2
    assert Document(URI, "").offset_at(pos(0, 0), strict=True) == 0
    assert Document(URI, "x").offset_at(pos(1, 0), strict=True) is None


@pytest.mark.parametrize("odd", ["\f", "\v", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"])
def test_only_lsp_line_breaks_split_lines(odd):
    text = f"a = 1{odd}\nimport os\nos.pa"
    doc = Document(URI, text)
    assert len(doc.lines) == 3
    assert doc.offset_at(pos(2, 5), strict=True) == len(text)
    assert doc.offset_at(pos(3, 0), strict=True) is None  # past the end: nothing to complete


@pytest.mark.parametrize("brk", ["\n", "\r\n", "\r"])
def test_each_lsp_line_break_splits(brk):
    doc = Document(URI, f"a{brk}bc")
    assert doc.offset_at(pos(1, 2), strict=True) == len(f"a{brk}bc")
    assert doc.position_at(len(f"a{brk}b")) == pos(1, 1)


def test_an_edit_past_the_line_end_lands_at_the_line_end():
    ws = workspace("x = os.getcw")
    edit(ws, 2, (0, 99), (0, 99), "d")
    assert ws.get_text_document(URI).source == "x = os.getcwd"


def test_an_edit_past_the_line_end_of_an_inner_line_keeps_the_line_break():
    ws = workspace("ab\ncd\n")
    edit(ws, 2, (0, 50), (0, 50), "!")
    assert ws.get_text_document(URI).source == "ab!\ncd\n"


def test_a_reversed_range_is_applied_as_the_normal_one():
    text = "line0\n0123456789abcdefghij\nlast"
    ws = workspace(text)
    edit(ws, 2, (1, 20), (1, 9), "X")
    assert ws.get_text_document(URI).source == "line0\n012345678X\nlast"


def test_a_stale_version_is_dropped_and_the_newest_text_stays():
    ws = workspace("a", version=1)
    edit(ws, 5, (0, 1), (0, 1), "b")
    edit(ws, 3, (0, 0), (0, 2), "OLD")
    doc = ws.get_text_document(URI)
    assert doc.source == "ab" and doc.version == 5


def test_a_change_to_a_document_that_is_not_open_is_dropped():
    ws = workspace("a")
    ws.update_text_document(
        types.VersionedTextDocumentIdentifier(uri="file:///other.py", version=2),
        types.TextDocumentContentChangeWholeDocument(text="x"))
    assert ws.get_text_document(URI).source == "a"


def test_clean_replaces_lone_surrogates_one_for_one():
    text = "s = '\ud800'\n"
    out = clean(text)
    assert len(out) == len(text) and "\ud800" not in out
    out.encode("utf-8")  # a tokenizer can take it now
    assert clean("fine 😀") == "fine 😀"
