"""The document model (issue 13, items 1-4): the server's copy equals the editor's.

Plain unit tests over documents.Document / documents.Workspace (pygls subclasses): no server.
Each case failed with pygls's own TextDocument/Workspace.
"""

import logging

import pytest
from lsprotocol import types
from pygls.workspace import PositionCodec

from codespec_lsp.lsp import documents
def pos(line: int, char: int) -> types.Position:
    return types.Position(line=line, character=char)


def change(sl: int, sc: int, el: int, ec: int, text: str) -> types.TextDocumentContentChangePartial:
    return types.TextDocumentContentChangePartial(
        range=types.Range(start=pos(sl, sc), end=pos(el, ec)), text=text)


def workspace(encoding=types.PositionEncodingKind.Utf16) -> documents.Workspace:
    return documents.Workspace(None, types.TextDocumentSyncKind.Incremental,
                               position_encoding=encoding)


def opened(text: str, uri: str = "file:///t.py", version: int = 1) -> documents.Workspace:
    ws = workspace()
    ws.put_text_document(types.TextDocumentItem(uri=uri, language_id="python", version=version,
                                                text=text))
    return ws


def edit(ws: documents.Workspace, version: int, *changes, uri: str = "file:///t.py") -> str:
    ident = types.VersionedTextDocumentIdentifier(uri=uri, version=version)
    for c in changes:
        ws.update_text_document(ident, c)
    return ws.get_text_document(uri).source


# ------------------------------------------------------------------ item 1: line breaks

@pytest.mark.parametrize("sep", ["\f", "\v", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"])
def test_only_lsp_line_breaks_split_lines(sep):
    doc = opened(f"a = 1{sep}\nimport os\nos.pa").get_text_document("file:///t.py")
    assert doc.lines == (f"a = 1{sep}\n", "import os\n", "os.pa")
    # 2:5 is after "os.pa" (pygls's splitlines put it inside "import os").
    assert doc.source[:doc.offset_at(pos(2, 5))].endswith("os.pa")
    assert doc.offset_at(pos(3, 0), strict=True) is None  # past the end
    assert doc.position_at(len(doc.source)) == pos(2, 5)


def test_split_lines_matches_the_three_lsp_breaks():
    assert documents.split_lines("a\r\nb\rc\nd\u2028e") == ["a\r\n", "b\r", "c\n", "d\u2028e"]
    assert documents.split_lines("x\n") == ["x\n"]
    assert documents.split_lines("") == []


@pytest.mark.parametrize("brk", ["\n", "\r\n", "\r"])
def test_each_lsp_line_break_splits(brk):
    doc = documents.Document("file:///p.py", f"a{brk}bc")
    assert doc.offset_at(pos(1, 2), strict=True) == len(f"a{brk}bc")
    assert doc.position_at(len(f"a{brk}b")) == pos(1, 1)


def test_crlf_counts_as_one_break_and_the_middle_is_the_line_end():
    doc = opened("ab\r\ncd").get_text_document("file:///t.py")
    assert doc.offset_at(pos(1, 1)) == 5
    assert doc.offset_at(pos(0, 9)) == 2  # clamped to the line end, before "\r\n"
    assert doc.position_at(3) == pos(0, 2)  # between "\r" and "\n"


def test_edit_after_a_form_feed_lands_on_its_line():
    ws = opened("a = 1\f\nimport os\nos.pa")
    assert edit(ws, 2, change(2, 5, 2, 5, "th")) == "a = 1\f\nimport os\nos.path"


# ------------------------------------------------------------------ item 2: past the line end

def test_edit_past_the_end_of_the_last_line_appends():
    ws = opened("x = os.getcw")
    assert edit(ws, 2, change(0, 99, 0, 99, "d")) == "x = os.getcwd"


def test_edit_past_the_end_of_a_middle_line_goes_to_its_end():
    ws = opened("ab\ncd\n")
    assert edit(ws, 2, change(0, 50, 0, 50, "!")) == "ab!\ncd\n"


def test_line_past_the_end_means_the_end_of_the_document():
    ws = opened("ab\n")
    assert edit(ws, 2, change(7, 0, 9, 3, "z")) == "ab\nz"


def test_utf16_positions_with_astral_characters():
    ws = opened("s = '😀x'")  # the emoji is two UTF-16 units
    assert edit(ws, 2, change(0, 7, 0, 8, "y")) == "s = '😀y'"
    doc = ws.get_text_document("file:///t.py")
    assert doc.position_at(len("s = '😀")) == pos(0, 7)
    # Inside the pair: after it.
    assert doc.offset_at(pos(0, 6)) == len("s = '😀")


def test_utf32_positions_count_code_points():
    ws = workspace(types.PositionEncodingKind.Utf32)
    ws.put_text_document(types.TextDocumentItem(uri="file:///t.py", language_id="python",
                                                version=1, text="😀ab"))
    assert edit(ws, 2, change(0, 1, 0, 2, "X")) == "😀Xb"


# ------------------------------------------------------------------ item 3: reversed range

def test_reversed_range_is_normalised(caplog):
    text = "first line\nsecond line here is long\n"
    ws = opened(text)
    with caplog.at_level(logging.WARNING, "codespec_lsp.lsp.documents"):
        got = edit(ws, 2, change(1, 20, 1, 9, "X"))
    assert got == edit(opened(text), 2, change(1, 9, 1, 20, "X"))
    assert got == "first line\nsecond liXlong\n"
    assert "reversed range" in caplog.text


# ------------------------------------------------------------------ item 4: stale versions

def test_stale_version_is_logged_and_the_newest_text_stays(caplog):
    ws = opened("v1")
    edit(ws, 5, change(0, 0, 0, 2, "v5"))
    with caplog.at_level(logging.WARNING, "codespec_lsp.lsp.documents"):
        assert edit(ws, 3, change(0, 0, 0, 2, "v3")) == "v5"
    assert ws.get_text_document("file:///t.py").version == 5
    assert "version 3 after version 5" in caplog.text
    assert edit(ws, 6, change(0, 2, 0, 2, "!")) == "v5!"


def test_change_for_a_document_that_is_not_open_is_dropped(caplog):
    ws = opened("x")
    with caplog.at_level(logging.WARNING, "codespec_lsp.lsp.documents"):
        ws.update_text_document(types.VersionedTextDocumentIdentifier(
            uri="file:///other.py", version=2), change(0, 0, 0, 0, "y"))
    assert "not open" in caplog.text
    assert "file:///other.py" not in ws.text_documents


def test_full_text_change_replaces_the_document():
    ws = opened("old")
    assert edit(ws, 2, types.TextDocumentContentChangeWholeDocument(text="new\n")) == "new\n"


# ------------------------------------------------------------------ item 5 (server side)

def test_clean_replaces_lone_surrogates_one_for_one():
    text = "s = '\ud800'\n"
    cleaned = documents.clean(text)
    assert len(cleaned) == len(text) and "\ud800" not in cleaned
    cleaned.encode("utf-8")  # a tokenizer can take it now
    assert documents.clean("😀 ok") == "😀 ok"


def test_like_keeps_the_encoding():
    ws = workspace(types.PositionEncodingKind.Utf32)
    assert documents.Workspace.like(ws).position_encoding == types.PositionEncodingKind.Utf32
    assert isinstance(documents.Workspace.like(ws).position_codec, PositionCodec)


# ------------------------------------------------------------------ positions of requests
# (moved from test_server_e2e.py, where they tested server._offset)

@pytest.mark.parametrize("encoding,col", [
    (types.PositionEncodingKind.Utf16, 23),
    (types.PositionEncodingKind.Utf8, len("greeting = '日本😀'; x = ".encode())),
    (types.PositionEncodingKind.Utf32, 22),
])
def test_offset_in_each_encoding(encoding, col):
    text = "import os\ngreeting = '日本😀'; x = \nz"
    doc = documents.Document("file:///p.py", text, position_codec=PositionCodec(encoding))
    off = doc.offset_at(pos(1, col), strict=True)
    assert text[:off].endswith("; x = ") and text[off] == "\n"
    assert doc.offset_at(pos(1, col + 1), strict=True) is None
    assert doc.offset_at(pos(3, 0), strict=True) is None
    assert doc.offset_at(pos(2, 1), strict=True) == len(text)
    assert doc.offset_at(pos(1, col + 1)) == off  # clamped, for edits


def test_offset_on_the_line_after_a_final_newline():
    assert documents.Document("file:///p.py", "x\n").offset_at(pos(1, 0), strict=True) == 2
    assert documents.Document("file:///p.py", "").offset_at(pos(0, 0), strict=True) == 0
    assert documents.Document("file:///p.py", "x").offset_at(pos(1, 0), strict=True) is None


# ------------------------------------------------------------ edited spans (issue 27)

def spans(doc: documents.Document) -> list[tuple[int, int]]:
    return [(a, b) for a, b, _ in doc.edited]


def test_typing_in_a_line_records_that_line():
    ws = opened("a\nb\nc\nd\n")
    ws.update_text_document(types.VersionedTextDocumentIdentifier(uri="file:///t.py", version=2),
                            change(2, 1, 2, 1, "x"))
    assert spans(ws.get_text_document("file:///t.py")) == [(2, 2)]


def test_lines_added_or_removed_above_move_a_span_and_touching_changes_join_it():
    doc = documents.Document("file:///t.py", "a\nb\nc\nd\ne\nf\ng\n")
    doc.apply_change(change(5, 1, 5, 1, "x"))         # f -> fx
    doc.apply_change(change(0, 0, 0, 0, "n1\nn2\n"))  # two lines above, the span is apart
    assert spans(doc) == [(7, 7), (0, 1)]
    assert doc.source.split("\n")[7] == "fx"
    doc.apply_change(change(1, 0, 3, 0, ""))          # n2 and a removed: fx moves up two
    assert doc.source.split("\n")[5] == "fx" and (5, 5) in spans(doc)
    doc.apply_change(change(6, 1, 6, 1, "y"))         # g -> gy, next to fx: one span, latest
    assert spans(doc)[-1] == (5, 6) and (5, 5) not in spans(doc)


def test_a_change_between_two_spans_joins_both():
    doc = documents.Document("file:///t.py", "a\nb\nc\nd\ne\nf\n")
    doc.apply_change(change(1, 1, 1, 1, "x"))
    doc.apply_change(change(3, 1, 3, 1, "y"))
    assert spans(doc) == [(1, 1), (3, 3)]
    doc.apply_change(change(2, 1, 2, 1, "z"))
    assert spans(doc) == [(1, 3)]


def test_an_inserted_line_is_its_own_span_not_the_line_after_it():
    doc = documents.Document("file:///t.py", "a\nb\nc\nd\ne\n")
    doc.apply_change(change(3, 1, 3, 1, "\nnew"))
    assert spans(doc) == [(4, 4)] and doc.source.split("\n")[4] == "new"


def test_a_whole_document_change_records_the_lines_it_changed():
    ws = workspace()
    ws.put_text_document(types.TextDocumentItem(uri="file:///t.py", language_id="python",
                                                version=1, text="a\nb\nc\nd\ne\n"))
    ws.update_text_document(types.VersionedTextDocumentIdentifier(uri="file:///t.py", version=2),
                            types.TextDocumentContentChangeWholeDocument(text="a\nb\nX\nY\nd\ne\n"))
    assert spans(ws.get_text_document("file:///t.py")) == [(2, 3)]


def test_a_stale_change_records_nothing():
    ws = opened("a\nb\n", version=3)
    ws.update_text_document(types.VersionedTextDocumentIdentifier(uri="file:///t.py", version=2),
                            change(0, 0, 0, 0, "x"))
    assert spans(ws.get_text_document("file:///t.py")) == []


def test_spans_are_bounded_and_chunks_come_latest_first_across_documents():
    a = documents.Document("file:///a.py", "\n".join(f"a{i}" for i in range(60)))
    b = documents.Document("file:///b.py", "\n".join(f"b{i}" for i in range(60)))
    for i in range(0, 40, 4):  # ten changes apart from each other in a
        a.apply_change(change(i, 0, i, 0, "#"))
    assert len(a.edited) == documents.MAX_EDITED_SPANS
    b.apply_change(change(10, 0, 10, 0, "#"))
    chunks = documents.edited_chunks([a, b], limit=3)
    assert chunks == [("file:///b.py", "b9\n#b10\nb11"), ("file:///a.py", "a35\n#a36\na37"),
                      ("file:///a.py", "a31\n#a32\na33")]


def test_a_long_span_shows_its_first_lines_and_one_line_either_side():
    doc = documents.Document("file:///t.py", "top\nbottom\n")
    doc.apply_change(change(1, 0, 1, 0, "".join(f"line{i}\n" for i in range(40))))
    (_, text), = documents.edited_chunks([doc])
    lines = text.split("\n")
    assert lines[0] == "top" and lines[1] == "line0"
    assert len(lines) == documents.EDITED_CHUNK_LINES + 2


@pytest.mark.parametrize("eol", ["\r", "\r\n"])
def test_spans_count_every_lsp_line_break(eol):
    doc = documents.Document("file:///t.py", eol.join("abcdef") + eol)
    doc.apply_change(change(3, 1, 3, 1, "x"))             # d -> dx
    doc.apply_change(change(0, 0, 0, 0, f"n1{eol}n2{eol}"))  # two lines above move it down two
    assert spans(doc) == [(5, 5), (0, 1)]
    doc.apply_change(change(5, 2, 5, 2, f"{eol}new"))     # a line inserted after dx joins it
    assert spans(doc)[-1] == (5, 6)
    (_, text), *_ = documents.edited_chunks([doc])
    assert text == f"c{eol}dx{eol}new{eol}e"
