import re

from codespec_lsp.completion.context import ContextBuilder, fim_prompt


class CountingTokenizer:
    """Whitespace-separated words and single symbols; counts calls so tests can bound work."""

    def __init__(self):
        self.calls = 0
        self.chars = 0

    def __call__(self, text: str) -> int:
        self.calls += 1
        self.chars += len(text)
        return len(re.findall(r"\w+|[^\w\s]", text))


def _doc(lines: int) -> str:
    return "".join(f"value_{i} = compute({i})\n" for i in range(lines))  # 6 tokens a line


def test_small_document_is_whole_prefix():
    tok = CountingTokenizer()
    b = ContextBuilder(tok, budget=200)
    src = "import os\nx = 1\n"
    p = b.build("a", src, len(src))
    assert p.text == src and p.cut == 0 and not p.fim


def test_a_file_is_headed_by_its_path_while_the_prompt_starts_at_its_start():
    """A new or short file: `# pkg/utils.py` says what the code is (smol wrote prose after a bare
    `def`). The header is fixed while the user types (each keystroke extends the prompt) and gone
    once the prompt starts inside the file; unknown languages get none."""
    tok = CountingTokenizer()
    b = ContextBuilder(tok, budget=120)
    assert b.build("file:///w/pkg/utils.py", "def", 3).text == "# utils.py\ndef"
    assert b.build("file:///w/app.ts", "export ", 7).text == "// app.ts\nexport "
    assert b.build("file:///w/notes.txt", "To do", 5).text == "To do"
    assert b.build("untitled:Untitled-1", "def", 3).text == "def"
    rooted = b.build("file:///w/pkg/cli.py", "", 0, roots=["file:///w"])
    assert rooted.text == "# pkg/cli.py\n" and rooted.prefix == "" and rooted.cut == 0
    typed, prompts = "", []
    for ch in "import os\n":
        typed += ch
        prompts.append(b.build("file:///w/pkg/cli.py", typed, len(typed)).text)
    assert all(b.startswith(a) for a, b in zip(prompts, prompts[1:]))
    src = _doc(500)
    p = b.build("file:///w/pkg/cli.py", src, len(src))
    assert p.cut > 0 and p.text == p.prefix and tok(p.text) <= 120
    short = _doc(10)  # 60 tokens: the header and the file within the budget
    p = b.build("file:///w/pkg/small.py", short, len(short))
    assert p.cut == 0 and p.text == "# small.py\n" + short and tok(p.text) <= 120


def test_prefix_fits_budget_and_starts_at_line():
    tok = CountingTokenizer()
    b = ContextBuilder(tok, budget=120)
    src = _doc(500)
    p = b.build("a", src, len(src))
    assert tok(p.prefix) <= 120
    assert p.cut > 0 and src[p.cut - 1] == "\n"


def test_cut_is_stable_while_typing():
    tok = CountingTokenizer()
    b = ContextBuilder(tok, budget=120)
    src = _doc(500)
    first = b.build("a", src, len(src)).cut
    typed = src
    cuts = set()
    for ch in "result = value_1 + value_2\n":
        typed += ch
        cuts.add(b.build("a", typed, len(typed)).cut)
    # 27 keystrokes add ~8 tokens: well inside the 25% head-room, so the start never moves.
    assert cuts == {first}


def test_recut_happens_in_coarse_steps():
    tok = CountingTokenizer()
    b = ContextBuilder(tok, budget=120)
    src = _doc(300)
    cuts = []
    for extra in range(0, 60):
        text = src + _doc(extra)
        cuts.append(b.build("a", text, len(text)).cut)
    moves = sum(1 for x, y in zip(cuts, cuts[1:]) if x != y)
    # 60 lines of 6 tokens = 360 tokens typed; one recut per ~30 tokens (25% of 120).
    assert 1 <= moves <= 60 * 6 // 25


def test_cursor_moving_above_cut_recuts():
    tok = CountingTokenizer()
    b = ContextBuilder(tok, budget=120)
    src = _doc(500)
    b.build("a", src, len(src))
    mid = len(src) // 2
    p = b.build("a", src, mid)
    assert p.cut < mid and tok(p.prefix) <= 120 and p.prefix.endswith(src[mid - 20:mid])


def test_huge_document_tokenizes_bounded_text():
    tok = CountingTokenizer()
    b = ContextBuilder(tok, budget=100)
    src = _doc(60_000)  # ~1.5 MB
    assert len(src) > 1_000_000
    b.build("a", src, len(src))
    assert tok.chars < 100 * 8 * 20  # a few windows of budget*8 chars, never the document


def test_one_huge_line():
    tok = CountingTokenizer()
    b = ContextBuilder(tok, budget=50)
    src = "x = [" + ", ".join(str(i) for i in range(10_000))
    p = b.build("a", src, len(src))
    assert tok(p.prefix) <= 50 * 3


def test_fim_template_and_suffix():
    tok = CountingTokenizer()
    b = ContextBuilder(tok, budget=400, fim_tokens=("<PRE>", "<SUF>", "<MID>"))
    src = "def f(x):\n    \n    return y\n"
    off = src.index("    \n") + 4
    p = b.build("a", src, off)
    assert p.fim
    assert p.text == "<PRE> def f(x):\n     <SUF>\n    return y\n <MID>"
    assert p.suffix == "\n    return y\n"


def test_fim_template_without_spaces_for_other_families():
    assert fim_prompt(("<fim_prefix>", "<fim_suffix>", "<fim_middle>"), "a", "b") == \
        "<fim_prefix>a<fim_suffix>b<fim_middle>"


def test_prefix_only_model_keeps_suffix_for_postprocess():
    b = ContextBuilder(CountingTokenizer(), budget=400)
    src = "print()\n"
    p = b.build("a", src, 6)
    assert p.text == "print(" and p.suffix == ")\n"


def test_forget_drops_state():
    tok = CountingTokenizer()
    b = ContextBuilder(tok, budget=120)
    src = _doc(500)
    b.build("a", src, len(src))
    b.forget("a")
    assert "a" not in b._state
