"""bench server --pause-ms: Enter types the next line's indentation with it, as editors do, and
the request made there is the one a pause measures."""

from codespec_lsp.bench.server import _Doc, _keystroke, _type_one


class _Recorder:
    def __init__(self) -> None:
        self.changes: list[str] = []

    def text_document_did_change(self, params) -> None:
        self.changes.append(params.content_changes[0].text)


def test_enter_types_the_indentation_with_it_and_the_document_stays_in_step():
    doc = _Doc("file:///x.py", ["def f():"], "\n    return 1\n", line=0, col=8)
    client = _Recorder()
    n = _keystroke(doc, auto_indent=True)
    assert n == 5  # "\n" and four spaces
    _type_one(client, doc, n)
    assert client.changes == ["\n    "] and doc.lines == ["def f():", "    "]
    assert (doc.line, doc.col) == (1, 4) and doc.rest == "return 1\n"
    assert _keystroke(doc, auto_indent=True) == 1  # mid-line: one character a key
    while doc.rest:
        _type_one(client, doc, _keystroke(doc, auto_indent=True))
    assert "\n".join(doc.lines) == "def f():\n    return 1\n"


def test_without_auto_indent_every_key_is_one_character():
    doc = _Doc("file:///x.py", ["x = 1"], "\n  y", line=0, col=5)
    assert _keystroke(doc, auto_indent=False) == 1
