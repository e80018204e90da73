"""The quality gates of postprocess.finalize: loops, confidence, re-typed suffix, next line,
doubled indentation, leading blank lines, a last line the token limit cut."""

import math

import pytest

from codespec_lsp.config import SettingsLayers
from codespec_lsp.completion.postprocess import (
    DEFAULT_MIN_CONFIDENCE,
    NEXT_LINE_MARGIN,
    Mode,
    blank_lines_above,
    longest_blank_run,
    cut_unconfident,
    drop_unfinished_line,
    decide_mode,
    drop_empty_comment_end,
    finalize,
    find_loop,
    keywords_above,
    line_confidences,
    line_finished,
    retypes_suffix,
    trim_blank_lead,
)


def spans(text: str, per_token: list[float], size: int = 2) -> list[tuple[int, float]]:
    """Fake per-token log-probs: a token every `size` characters of `text`."""
    ends = list(range(size, len(text), size)) + [len(text)]
    assert len(ends) == len(per_token)
    return list(zip(ends, per_token))


class TestLoops:
    @pytest.mark.parametrize("text", [
        "but, but, but, but",
        "run_run_run_run",
        "str(str(str(str(",
        "x = 1\nx = 1\n",
        "a = f(x)\nb = g(y)\na = f(x)\nb = g(y)",
        "self.x = 1\n\nself.x = 1",
        "f(None, None, None, None)",
    ])
    def test_a_loop_is_found(self, text):
        assert find_loop(text) is not None

    @pytest.mark.parametrize("text", [
        "[0, 0, 0]",
        "# ------------------",
        "# __________________",
        "return found",
        "x = a + b\ny = a - b",
        "        )\n    )\n)",
        "proc.__exit__(None, None, None)",
        "mask = 0xffffffffffffffff",
        "third = 0.3333333333",
        "data = b'\\x00\\x00\\x00\\x00\\x00'",
        "'test test test'",
        "try:\n    try:\n        pass",
    ])
    def test_code_that_repeats_a_little_is_not_a_loop(self, text):
        assert find_loop(text) is None

    def test_a_run_of_one_symbol_after_code_is_a_loop(self):
        # bench quality met this one: `self.value !` answered with 47 `!`, shown, uncounted
        assert finalize("!" * 47, "        return self.value !", "", Mode(False, 0)) is None
        assert finalize("= value or self.x ==========", "    if a !", "", Mode(False, 0)) == "= value or self.x"
        assert find_loop("x = 1\n    y ========= 2") == len("x = 1")  # a later line goes whole

    @pytest.mark.parametrize("text, line_prefix", [
        ("==========", "    # "),             # a banner comment
        ("x = 1  # ==========", ""),
        ('print("==========")', ""),            # a string
        ("----------", "    "),                 # a reST underline in a docstring: a line of its own
        ("int x; /* ********** */", ""),        # C comments, SQL and Lua ones
        ("x = 1 -- ----------", ""),
        ("))))))))))", "(f (g (h"),             # brackets are balance_brackets' business
    ])
    def test_rulers_in_comments_strings_and_own_lines_are_not_loops(self, text, line_prefix):
        assert find_loop(text, line_prefix) is None

    def test_the_first_line_counts_at_the_cursors_indentation(self):
        # the first line follows the editor's indentation; a stray leading space does not count
        assert find_loop(" x.append(1)\n    x.append(1)", "    ") is not None
        assert find_loop("try:\n        try:", "    ") is None

    def test_a_loop_on_the_first_line_is_cut_where_it_starts(self):
        assert finalize("self.run_run_run_run_run()", "    ", "", Mode(False, 0)) == "self."
        assert finalize("x = str(str(str(str(str(a", "    ", "", Mode(False, 0)) == "x ="
        assert finalize("str(str(str(str(str(a", "    ", "", Mode(False, 0)) is None

    def test_a_later_line_holding_a_loop_is_dropped(self):
        raw = "x = compute(a)\n    y = str(str(str(str(str(a\n    z = 3"
        assert finalize(raw, "    ", "", Mode(True, 4)) == "x = compute(a)"

    def test_a_list_item_repeated_under_the_next_number_is_kept_once(self):
        # smol in a docstring: the counter goes on, the item does not
        raw = ("A module that reads it.\n    5. A module that reads it.\n"
               "    6. A module that reads it.")
        assert finalize(raw, "    4. ", "", Mode(True, 4)) == "A module that reads it."
        assert find_loop("# 1) load the file\n# 2) load the file") == len("# 1) load the file")

    @pytest.mark.parametrize("text", [
        "1. Read the file.\n2. Parse it.\n3. Write the result.",   # items of their own
        "(1, 0, 0),\n(2, 0, 0),",                                   # digits elsewhere: data
        "x1 = compute(1)\nx2 = compute(2)",
    ])
    def test_a_list_or_a_table_is_not_a_loop(self, text):
        assert find_loop(text) is None

    def test_a_repeated_line_is_kept_once(self):
        out = finalize("x.append(1)\n    x.append(1)\n    x.append(1)\n", "    ", "", Mode(True, 4))
        assert out == "x.append(1)"
        raw = "a = f(x)\n    b = g(y)\n    a = f(x)\n    b = g(y)\n"
        assert finalize(raw, "    ", "", Mode(True, 4)) == "a = f(x)\n    b = g(y)"


class TestConfidence:
    def test_line_confidences_are_the_mean_of_each_lines_tokens(self):
        text = "aaaa\nbbbb"
        # tokens: "aa" "aa" "\nb" "bb" "b" -> the "\nb" token ends on line 1
        got = line_confidences(text, [(2, -1.0), (4, -3.0), (6, -0.5), (8, -0.5), (9, -0.5)])
        assert got == [-2.0, -0.5]

    def test_a_line_where_no_token_ends_has_no_confidence(self):
        # the newline is the last character of line 0: its token counts there
        assert line_confidences("ab\n", [(3, -1.0)]) == [-1.0, None]

    def test_cut_at_the_first_unconfident_line(self):
        text = "x = 1\ny = 2\nz = 3"
        lps = [(6, -0.1), (12, -5.0), (17, -0.1)]
        assert cut_unconfident(text, lps, -2.0) == "x = 1"

    def test_an_unconfident_first_line_shows_nothing(self):
        text = "value = compute()"
        out = finalize(text, "    ", "", Mode(False, 0), logprobs=spans(text, [-6.0] * 9),
                       min_confidence=math.exp(-2.0))
        assert out is None

    def test_the_threshold_is_a_setting(self):
        text = "value = compute()"
        lps = spans(text, [-3.0] * 9)
        mode = Mode(False, 0)
        assert finalize(text, "    ", "", mode, logprobs=lps, min_confidence=math.exp(-2.0)) is None
        assert finalize(text, "    ", "", mode, logprobs=lps, min_confidence=math.exp(-4.0)) == text

    def test_without_logprobs_the_gate_is_off(self):
        assert finalize("value = compute()", "    ", "", Mode(False, 0)) == "value = compute()"

    def test_min_confidence_setting_is_read_in_camel_case_and_checked(self):
        layers = SettingsLayers()
        errors, _ = layers.set_init({"minConfidence": 0.2})
        assert not errors and layers.effective().min_confidence == 0.2
        errors, _ = layers.set_workspace({"codespec": {"minConfidence": 3}})
        assert errors and "minConfidence" in errors[0]
        assert layers.effective().min_confidence == 0.2


class TestNextLine:
    def test_a_finished_line_allows_the_next_line(self):
        assert decide_mode("    x = f(y)", "").next_line
        assert line_finished("return x")

    @pytest.mark.parametrize("line", ["x = f(y,", "x = a +", "if a and", "x = [1, 2"])
    def test_an_unfinished_line_does_not(self, line):
        assert not line_finished(line)
        assert not decide_mode(line, "").next_line

    def test_the_next_line_is_shown_only_when_confident(self):
        mode = decide_mode("    x = f(y)", "")
        raw = "\n    return x\n"
        sure = [(len(raw), -0.1)]
        # above the line threshold, but not by the margin that interrupting needs
        unsure = [(len(raw), math.log(DEFAULT_MIN_CONFIDENCE) + NEXT_LINE_MARGIN / 2)]
        assert finalize(raw, "    x = f(y)", "", mode, logprobs=sure) == "\n    return x"
        assert finalize(raw, "    x = f(y)", "", mode, logprobs=unsure) is None
        assert finalize(raw, "    x = f(y)", "", mode) is None  # no confidence known

    def test_mid_line_stays_one_line(self):
        assert finalize("foo(a)\nbar()", "x = ", "", Mode(False, 0)) == "foo(a)"


class TestSuffixAndIndent:
    def test_retyping_the_suffix_is_dropped(self):
        assert retypes_suffix("(a, b)", "(a,  b)\n")
        assert finalize("(a, b)", "foo", "(a, b)", Mode(False, 0)) is None

    def test_new_text_before_the_suffix_is_kept(self):
        assert not retypes_suffix("(a, b, c)", "(a, b)")

    def test_no_extra_space_after_the_editors_indentation(self):
        out = finalize(" if isinstance(x, int):", "    ", "", Mode(False, 0))
        assert out == "if isinstance(x, int):"

    def test_an_empty_line_shallower_than_its_block_keeps_the_models_indent(self):
        # cursor at column 4 on the line after `    def f(x):`: the body needs 8
        assert finalize("    return x", "    ", "", Mode(True, 5)) == "    return x"


class TestBlankLead:
    """On an empty line, blank lines a suggestion starts with go where PEP 8's limit (two before
    top-level code, one inside a block) would be passed; the code then starts at the cursor."""

    def test_blank_lines_above_counts_only_the_run_right_above(self):
        source = "x = 1\n\ny = 2\n\n  \n    "
        assert blank_lines_above(source, len(source)) == 2
        assert blank_lines_above("x = 1\n", 6) == 0
        assert blank_lines_above("\n\n", 2) == 2  # the document's first line counts too

    def test_top_level_code_under_two_blank_lines_starts_at_the_cursor(self):
        assert trim_blank_lead("\nclass A:\n    pass", "", 2) == "class A:\n    pass"

    def test_a_blank_line_pep8_wants_is_kept(self):
        assert trim_blank_lead("\nclass A:", "", 1) == "\nclass A:"

    def test_only_the_blank_lines_past_the_limit_go(self):
        assert trim_blank_lead("\n\n\ndef f():", "", 0) == "\n\ndef f():"

    def test_in_a_block_the_code_starts_after_the_typed_indentation(self):
        assert trim_blank_lead("\n\n        if x:\n            y", "        ", 1) == "if x:\n            y"

    def test_code_not_under_the_cursors_indentation_is_left(self):
        assert trim_blank_lead("\n\tif x:", "    ", 1) == "\n\tif x:"

    def test_a_typed_line_or_code_at_the_cursor_is_left(self):
        assert trim_blank_lead("\n\nclass A:", "x = ", 2) == "\n\nclass A:"
        assert trim_blank_lead("class A:\n\n\nx", "", 2) == "class A:\n\n\nx"

    def test_a_document_that_never_leaves_two_blank_lines_sets_a_limit_of_one(self):
        # smol in zod's TypeScript, under one blank line: `\n// ZodCatch`
        assert trim_blank_lead("\n// ZodCatch", "", 1, blank_limit=1) == "// ZodCatch"
        assert trim_blank_lead("\n// ZodCatch", "", 1, blank_limit=2) == "\n// ZodCatch"
        # a document with no blank line yet still gets one before new code
        assert trim_blank_lead("\nclass A:", "", 0, blank_limit=0) == "\nclass A:"
        assert finalize("\n// ZodCatch", "", "", Mode(True, 0), blank_above=1, blank_limit=1) == \
            "// ZodCatch"

    def test_at_the_top_of_the_file_the_code_starts_at_the_cursor(self):
        # smol under the path comment that heads a new file's prompt: `\nimport os`
        assert trim_blank_lead("\nimport os", "", 0, top_of_file=True) == "import os"
        assert trim_blank_lead("\nimport os", "", 0) == "\nimport os"
        assert finalize("\nimport os\nimport re", "", "", Mode(True, 0),
                        top_of_file=True) == "import os\nimport re"

    def test_the_longest_blank_run_leaves_out_the_one_at_the_cursor(self):
        source = "a = 1\n\nb = 2\n\n\n\nc = 3\n"
        assert longest_blank_run(source, len("a = 1\n\nb = 2\n\n\n")) == 2  # one run split
        assert longest_blank_run(source, len(source)) == 3
        assert longest_blank_run("x = 1\n  \n\ty = 2\n", 0) == 1  # whitespace-only is blank
        assert longest_blank_run("", 0) == 0
        crlf = "a = 1\r\n\r\n\r\ndef f():\r\n    pass\r\n\r\n"  # as blank_lines_above reads it
        assert longest_blank_run(crlf, len(crlf)) == 2 and blank_lines_above(crlf, len(crlf)) == 1

    def test_finalize_trims_and_keeps_each_lines_confidence(self):
        # Tokens "\n", "class A:\n", "    x = 1\n" (unconfident), "    y = 2": the shown text
        # starts at `class`, and the cut falls on the unconfident line, not one line off.
        raw = "\nclass A:\n    x = 1\n    y = 2"
        lps = [(1, -0.1), (10, -0.1), (20, -9.0), (29, -0.1)]
        assert finalize(raw, "", "", Mode(True, 0), logprobs=lps, blank_above=2) == "class A:"
        assert finalize(raw, "", "", Mode(True, 0), logprobs=lps, blank_above=1) == "\nclass A:"


class TestTruncated:
    """A block the token limit cut short loses its last line; the first line always stays."""

    def test_the_unfinished_last_line_goes(self):
        raw = "for task in tasks:\n            total += task.cost\n            summary = tasks_cor"
        out = finalize(raw, "        ", "", Mode(True, 8), truncated=True)
        assert out == "for task in tasks:\n            total += task.cost"

    def test_a_block_that_ended_or_a_finished_generation_keeps_its_lines(self):
        raw = "for task in tasks:\n            total += task.cost"
        assert finalize(raw, "        ", "", Mode(True, 8)) == raw  # stopped at EOS or a stop
        ended = raw + "\n    return total"  # the dedent ended the block: nothing was cut short
        assert finalize(ended, "        ", "", Mode(True, 8), truncated=True) == raw

    @pytest.mark.parametrize("raw, shown", [
        # smol's truncated blocks on gepa and a2a-sdk: each ended on a line that only opens
        ("@abstractmethod\n    def best(self) -> int:\n        ...\n\n    @abstractmethod\n    def wo",
         "@abstractmethod\n    def best(self) -> int:\n        ..."),
        (')\n\n    if provided:\n        if provided is not None:\n            x = comp',
         ")"),
        ('x = 1\n    def f(self):\n        """\n        Ret', "x = 1"),
        # after prose, quotes may close the prompt's docstring: they stay
        ('the value.\n    """\n    return x +', 'the value.\n    """'),
        # google-adk: the operand of the `+` was on the line the cut dropped
        ("})\n_MIME_TYPES = _SUBTYPES +\n    _GEMINI_", "})"),
        ("x = 1\n    y = compute(a) \\\n        and", "x = 1"),
        # prose and star imports end on `.` and `*`: not operators
        ("from m import *\n    x = comp", "from m import *"),
        ("# the range is 1 -\n    x = comp", "# the range is 1 -"),
    ])
    def test_lines_that_open_what_the_cut_left_out_go_too(self, raw, shown):
        assert finalize(raw, "    ", "", Mode(True, 4), truncated=True) == shown

    def test_a_docstring_with_its_text_is_kept_and_a_block_that_ended_keeps_its_header(self):
        raw = '"""Handle a stream.\n\n        Args:\n            request: the request.\n            cont'
        assert finalize(raw, "        ", "", Mode(True, 8), truncated=True) == \
            '"""Handle a stream.\n\n        Args:\n            request: the request.'
        assert finalize("x = 1\n    if x:", "    ", "", Mode(True, 4)) == "x = 1\n    if x:"

    def test_the_first_line_is_never_dropped(self):
        assert drop_unfinished_line("value = compute(a, b") == "value = compute(a, b"
        assert drop_unfinished_line("\n    value = comp") == "\n    value = comp"
        assert drop_unfinished_line("if ready:\n    @cache\n    def f") == "if ready:"
        assert drop_unfinished_line("total = first +\n    sec") == "total = first +"
        assert finalize("value = total_of", "    ", "", Mode(False, 0), truncated=True) == "value = total_of"
        assert finalize("value = total_of", "    ", "", Mode(True, 4), truncated=True) == "value = total_of"


class TestGrownLines:
    def test_a_line_grown_by_a_copy_of_its_last_unit_is_a_loop(self):
        # smol on strands-agents, after `    from ...types.agent import LocalAgent`
        raw = ("from ...types.agent import LocalAgentType\n"
               "    from ...types.agent import LocalAgentTypeType\n"
               "    from ...types.agent import LocalAgentTypeTypeType")
        assert finalize(raw, "    ", "", Mode(True, 4)) == "from ...types.agent import LocalAgentType"
        assert find_loop("def test_load(self):\n\ndef test_load_load(self):") == \
            len("def test_load(self):")

    def test_a_line_grown_at_several_places_is_a_loop(self):
        # smol on zod's to-json-schema.ts, under `if (params.reused === "ref") {`
        raw = ("const defs = this.defs;\n          const defsRef = defsRef;\n"
               "          const defsRefRef = defsRefRef;\n          const defsRefRefRef = defsRefRefRef;")
        assert finalize(raw, "          ", "", Mode(True, 10)) == \
            "const defs = this.defs;\n          const defsRef = defsRef;"
        # where the text after a copy begins like the unit, the copy reads as a rotation of it
        assert find_loop("RefRx = 1\nRefRefRx = 1") == len("RefRx = 1")

    @pytest.mark.parametrize("text", [
        "x = np.zeros((n, n))\nx = np.zeros((n, n, n))",  # one letter a unit: data
        "x = f(ab, cd)\nx = f(abab, cdcd)",  # two units, one copy each: new names
        "const a = { ...defId, defId };\nconst aRef = { ...defIdRef, defIdRef };",
        "def test_load(self):\ndef test_load_all(self):",   # a new word, not the last one again
        "self.a.b = 1\nself.a.b.c = 1",
    ])
    def test_a_line_that_grows_by_new_text_is_not_a_loop(self, text):
        assert find_loop(text) is None


def test_a_run_of_one_symbol_past_the_widest_banner_is_a_loop_even_in_a_comment():
    # smol at the top of a TypeScript declaration: `// ` and 400 slashes
    assert finalize("\n// " + "/" * 400, "", "", Mode(True, 0)) is None
    assert finalize("// " + "/" * 400, "", "", Mode(True, 0)) is None
    assert finalize("x = 1  # " + "=" * 200, "", "", Mode(True, 0)) == "x = 1"
    assert finalize("=" * 200, "    # ", "", Mode(False, 0)) is None
    # a banner that fits is the user's style: kept, in a comment or a string
    assert find_loop("    # " + "=" * 70) is None
    assert find_loop('print("' + "-" * 100 + '")') is None


def test_a_line_of_symbols_three_times_is_a_loop_twice_is_not():
    # smol in a docstring of openai-agents' apply_diff.py: 23 lines of `^`
    assert finalize("^\n        ^\n        ^\n        ^", "        ", "", Mode(True, 8)) == "^"
    assert find_loop("    )\n    )") is None
    assert find_loop("x = [\n    0,\n    0,\n    0,\n]") is None


def test_a_line_again_after_one_other_at_its_indentation_ends_the_suggestion_after_both():
    # smol on gepa: a keyword argument given twice, a comment written again
    raw = ("new_program_idx=new_program_idx,\n                new_program=new_program,\n"
           "                new_program_idx=new_program_idx,")
    assert finalize(raw, "                ", "", Mode(True, 16)) == \
        "new_program_idx=new_program_idx,\n                new_program=new_program,"
    assert find_loop("# Stats\nstats = get()\n\n# Stats") == len("# Stats\nstats = get()")
    assert find_loop("if a:\n    f()\nelse:\n    f()") is None  # another block, not a loop


def test_a_run_of_one_symbol_unit_eight_times_is_a_loop():
    # smol at a docstring's line start on deepagents
    assert find_loop("1.0.0.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0") is not None
    for data in ("x = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]", "v = '1.0.0.0'", "x = 0,0,0,0,0,0,0,0,0,0"):
        assert find_loop(data) is None



def test_a_phrase_two_and_a_half_times_is_a_loop_twice_is_not():
    # smol in a comment on google-adk: the line holding the loop goes, the line above stays
    raw = ("# - ``x`` is a function_response\n"
           "#   that returns a function_response that is a function_response that is a function_response")
    assert finalize(raw, "", "", Mode(True, 0)) == "# - ``x`` is a function_response"
    # code says a phrase twice; symbols in the unit are _UNIT_RUN's business (3.5 copies)
    for code in ("if previous_identity is None or identity is None or previous_identity != identity:",
                 "assert greeting == 'Hello Bob Hello Bob Hello Bob '",
                 "def f() -> tuple[str | None, str | None, str | None]:"):
        assert find_loop(code) is None


def test_a_loop_that_starts_inside_a_word_keeps_the_word_whole():
    # smol on openai-agents: cut where the loop starts it showed `# \`on`
    assert finalize("# `on_delete_delete_delete_delete_delete", "    ", "", Mode(False, 0)) == "# `on_delete"
    assert finalize("x = fooBarBarBarBarBar", "    ", "", Mode(False, 0)) == "x = fooBar"
    assert finalize("self.run_run_run_run_run()", "    ", "", Mode(False, 0)) == "self."  # after a dot


def test_a_keyword_given_twice_in_one_list_ends_the_suggestion():
    # smol on google-adk, in one call: a SyntaxError from the second copy on
    raw = ('method=method,\n            signature=method,\n            signature_type="v2",\n'
           '            signature_type="v4",\n            signature_type="v2v",')
    assert finalize(raw, "            ", "", Mode(True, 12)) == \
        'method=method,\n            signature=method,\n            signature_type="v2",'
    params = "self,\n    path: Path,\n    user: str | None = None,\n    path: str = '',\n) -> None:"
    assert find_loop(params, "    ") == params.index("\n    path: str")
    for code in (
        "x = f(\n    a=1,\n    b=2,\n)\ny = f(\n    a=1,\n    b=2,\n)",           # two calls
        "polling = check(a,\n                 b)\npolling = check(c,\n                 d)",
        "[\n    lambda: f(x=1),\n    lambda: f(x=2),\n]",                          # lambdas
        "f(a=1,\n  b=2)\ng(a=1,\n  b=2)",
    ):
        assert find_loop(code) is None


def test_the_earliest_line_loop_wins_whichever_rule_finds_it():
    # smol on a2a-sdk: `release()` again after one other line came before the pair at the end,
    # which alone had kept the A-B-A lines
    raw = ("self._lock.acclose()\n            self._lock.release()\n            self._is_closed = False\n"
           "            self._lock.release()\n            self._lock.release()")
    assert finalize(raw, "            ", "", Mode(True, 12)) == \
        "self._lock.acclose()\n            self._lock.release()\n            self._is_closed = False"
    # a group of two before a pair of one
    assert find_loop("a = f(x)\nb = g(y)\na = f(x)\nb = g(y)\nc = 1\nc = 1") == len("a = f(x)\nb = g(y)")


def test_a_keyword_the_list_above_the_cursor_gave_is_not_suggested_again():
    # smol on openai-agents: `trace_workflow_name=...,` under the line that had given it
    source = ("result = run(\n    agent,\n    session=session,\n"
              "    trace_workflow_name=trace_workflow_name,\n    run_state=state,\n    ")
    given = keywords_above(source, len(source))
    assert given == {"session", "trace_workflow_name", "run_state"}
    assert finalize("trace_workflow_name=trace_workflow_name,\n    other=1,", "    ", "", Mode(True, 4),
                    keywords_given=given) is None
    assert finalize("conversation_id=cid,\n    session=s,", "    ", "", Mode(True, 4),
                    keywords_given=given) == "conversation_id=cid,"
    # another call's keywords, a deeper list's, and a cursor after code give nothing
    other = "f(\n    a=1,\n)\ng(\n    b=2,\n    "
    assert keywords_above(other, len(other)) == {"b"}
    nested = "f(\n    a=g(\n        x=1,\n    ),\n    b=2,\n    "
    assert keywords_above(nested, len(nested)) == {"b"}
    assert keywords_above("f(\n    a=1,\n    b", len("f(\n    a=1,\n    b")) == frozenset()


def test_an_if_whose_body_opens_with_the_same_test_keeps_the_first():
    # smol on deepagents
    raw = ('if spec is not None:\n        if spec is not None:\n'
           '            candidates.append(f"spec {spec!r}")\n        candidates.append(f"spec {spec!r}")')
    assert finalize(raw, "    ", "", Mode(True, 4)) == "if spec is not None:"
    assert find_loop("elif x > 1:\n    if x > 1:\n        y = 2") == len("elif x > 1:")
    for code in ("if a:\n    if b:\n        x = 1", "if ok:\n    x = 1\nif ok:\n    y = 2",
                 "while line.startswith('a'):\n    while line.startswith('a'):\n        line = next(f)"):
        assert find_loop(code) is None


class TestEmptyCommentEnd:
    """A last line that is a comment marker alone goes; with nothing before it, so does the
    suggestion (smol's `#` in an empty file under its path comment)."""

    def test_a_bare_marker_at_the_end_goes(self):
        assert drop_empty_comment_end("x = 1\n#") == "x = 1"
        assert drop_empty_comment_end("x = 1\n    //  ") == "x = 1"
        assert finalize("\n#", "", "", Mode(True, 0), top_of_file=True) is None
        assert finalize("#", "    ", "", Mode(True, 4)) is None

    def test_a_comment_with_words_or_a_marker_inside_code_stays(self):
        assert drop_empty_comment_end("# TODO") == "# TODO"
        assert drop_empty_comment_end("#\n# Licensed") == "#\n# Licensed"
        assert drop_empty_comment_end('url = "https://"') == 'url = "https://"'
        assert drop_empty_comment_end("x = 1  #") == "x = 1  #"  # after code: left to the model
