import pytest

from codespec_lsp.completion.postprocess import (
    Mode,
    balance_brackets,
    block_end,
    decide_mode,
    finalize,
    strip_trailing_whitespace,
    trim_suffix_overlap,
)


class TestDecideMode:
    def test_mid_line_with_text_to_the_right_is_one_line(self):
        assert decide_mode("x = foo(", "a, b)") == Mode(False, 0)

    def test_auto_inserted_closers_do_not_count_as_text(self):
        assert not decide_mode("print(", ")").multiline

    def test_after_block_opener_is_a_block_deeper_than_the_opener(self):
        mode = decide_mode("    def f(x):", "")
        assert mode.multiline and mode.min_indent == 5

    def test_empty_line_is_a_block_at_cursor_indent(self):
        assert decide_mode("        ", "") == Mode(True, 8)

    def test_empty_unindented_line_after_opener_blocks_deeper(self):
        assert decide_mode("", "", prev_line="    for x in y:") == Mode(True, 5)

    def test_end_of_statement_is_one_line(self):
        assert not decide_mode("    return x", "").multiline


class TestBlockEnd:
    def test_single_line_stops_at_newline(self):
        assert block_end("foo(x)\nbar", Mode(False, 0)) == 6

    def test_single_line_that_starts_with_newline_is_empty(self):
        assert block_end("\n    y = 1", Mode(False, 0)) == 0

    def test_partial_line_may_continue(self):
        assert block_end("foo(x", Mode(False, 0)) is None

    def test_block_stops_at_dedent(self):
        text = "\n    a = 1\n    return a\ndef g():\n"
        end = block_end(text, Mode(True, 1))
        assert text[:end] == "\n    a = 1\n    return a"

    def test_dedent_inside_brackets_does_not_stop(self):
        text = "x = [\n1,\n]\n    y"
        assert block_end(text, Mode(True, 4)) is None

    def test_two_blank_lines_end_a_block(self):
        text = "a = 1\n\n\nb = 2"
        assert text[:block_end(text, Mode(True, 0))] == "a = 1"

    def test_module_level_new_statement_after_blank_line_ends_block(self):
        text = "def f():\n    pass\n\ndef g():"
        assert text[:block_end(text, Mode(True, 0))] == "def f():\n    pass"

    def test_unjudged_last_line_keeps_going(self):
        # "  " could still become a deeper line: no verdict yet.
        assert block_end("a = 1\n  ", Mode(True, 4)) is None


class TestSuffixOverlap:
    def test_auto_closed_paren_is_not_doubled(self):
        assert trim_suffix_overlap("x)", "print(", ")\n") == "x"

    def test_nested_call_keeps_its_own_closer(self):
        assert trim_suffix_overlap("len(x))", "print(", ")") == "len(x)"

    def test_closer_not_closing_prefix_bracket_is_kept(self):
        assert trim_suffix_overlap("foo()", "x = ", ")") == "foo()"

    def test_two_closers(self):
        assert trim_suffix_overlap("x)]", "a[f(", ")]") == "x"

    def test_line_already_in_document_ends_suggestion(self):
        text = "\n    y = 2\n    return y"
        suffix = "\n\n    return y\n"
        assert trim_suffix_overlap(text, "    x = 1", suffix) == "\n    y = 2"


class TestBrackets:
    def test_single_line_gets_missing_closers(self):
        assert balance_brackets("foo(bar[1") == "foo(bar[1])"

    def test_single_line_ending_with_an_opener_stays_open(self):
        # smol mid-line: `from openai.types.realtime.conversation_item import (` then the names
        # on the next lines; closing it showed `import ()`
        assert balance_brackets("time.conversation_item import (") == \
            "time.conversation_item import ("
        assert finalize("time.item import (\n    Item,\n)", "from openai.types.real", "",
                        Mode(False, 0)) == "time.item import ("

    @pytest.mark.parametrize("line", [
        'self.trace_to_file["file_export_only',  # smol, a loop cut inside the key
        "#define SET_BINARY_MODE(file) setmode(fileno(file),",  # smol on zlib's examples
        "total = sum(a +",
        "f(x.",
    ])
    def test_single_line_ending_in_a_string_comma_or_operator_stays_open(self, line):
        # closers would land inside the string or after what still wants an operand
        assert balance_brackets(line) == line

    def test_multi_line_cut_back_to_balanced_line(self):
        assert balance_brackets("a = 1\nb = foo(\n  2,") == "a = 1"

    def test_brackets_in_strings_ignored(self):
        assert balance_brackets("print('(')") == "print('(')"

    def test_balanced_unchanged(self):
        assert balance_brackets("f(x)\ng(y)") == "f(x)\ng(y)"


def test_strip_trailing_whitespace():
    assert strip_trailing_whitespace("a  \n  b \n\n") == "a\n  b"


class TestFinalize:
    def test_never_whitespace_only(self):
        assert finalize("   \n  ", "x = 1", "", Mode(True, 0)) is None
        assert finalize("", "", "", Mode(False, 0)) is None

    def test_pipeline(self):
        raw = "x, y)\nprint(z)"
        assert finalize(raw, "    foo(", ")\n", Mode(False, 0)) == "x, y"

    def test_block_pipeline(self):
        raw = "\n        return a + b  \n\nclass C:\n"
        assert finalize(raw, "    def add(a, b):", "\n", Mode(True, 5)) == "\n        return a + b"

    def test_non_ascii(self):
        assert finalize("'日本語 😀')\n", "print(", ")", Mode(False, 0)) == "'日本語 😀'"
