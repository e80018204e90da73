import argparse

from codespec_lsp.cli import build_parser
from codespec_lsp.config import (
    Settings,
    SettingsLayers,
    default_context_tokens,
    from_cli,
    normalize,
)


def test_camel_and_snake_case_and_section():
    values, errors, unknown = normalize({"codespec": {"maxTokens": 12, "debounce_ms": 5}})
    assert values == {"max_tokens": 12, "debounce_ms": 5} and not errors and not unknown


def test_invalid_values_are_named_and_dropped():
    values, errors, _ = normalize({"maxTokens": "many", "debounceMs": -1, "enable": 1,
                                   "device": "tpu", "contextTokens": True})
    assert values == {}
    text = " ".join(errors)
    for key in ("maxTokens", "debounceMs", "enable", "device", "contextTokens"):
        assert key in text


def test_unknown_keys_are_separate_from_errors():
    values, errors, unknown = normalize({"python": {"x": 1}, "maxTokens": 8})
    assert values == {"max_tokens": 8} and errors == [] and unknown == ["python"]


def test_not_an_object():
    assert normalize([1, 2])[1] and normalize(None) == ({}, [], [])


def test_layers_later_wins_and_absent_keys_fall_back():
    layers = SettingsLayers(cli={"max_tokens": 10, "preset": "tiny"})
    layers.set_init({"maxTokens": 20})
    layers.set_workspace({"codespec": {"debounceMs": 7}})
    s = layers.effective()
    assert (s.max_tokens, s.preset, s.debounce_ms) == (20, "tiny", 7)
    layers.set_workspace({"codespec": {"maxTokens": 30}})
    s = layers.effective()
    assert s.max_tokens == 30 and s.debounce_ms == Settings().debounce_ms


def test_model_key_changes_only_with_model_settings():
    base = Settings()
    assert Settings(max_tokens=3).model_key() == base.model_key()
    assert Settings(target="/x").model_key() != base.model_key()
    assert Settings(device="cpu").model_key() != base.model_key()


def test_from_cli_keeps_only_given_flags():
    args = build_parser().parse_args(["serve", "--preset", "tiny", "--max-tokens", "9"])
    values = from_cli(args)
    assert values["preset"] == "tiny" and values["max_tokens"] == 9
    assert "allow_download" not in values and "draft" not in values


def test_from_cli_on_other_namespaces():
    assert from_cli(argparse.Namespace()) == {}


def test_default_context_tokens_leaves_room_and_is_capped():
    assert default_context_tokens(2048, 48) <= 2048 - 48
    assert default_context_tokens(100_000, 48) == 1536
    assert default_context_tokens(64, 48) >= 16


# ------------------------------------------------------------ the typed schema (issue 13)


def test_every_field_has_its_camel_case_key_and_takes_its_default():
    """The keys editors send are derived from the field names: none can be forgotten."""
    import dataclasses

    for f in dataclasses.fields(Settings):
        camel = f.name.split("_")[0] + "".join(w.capitalize() for w in f.name.split("_")[1:])
        values, errors, unknown = normalize({camel: getattr(Settings(), f.name)})
        assert not errors and not unknown, (camel, errors, unknown)
        assert values in ({f.name: getattr(Settings(), f.name)}, {}), camel  # {}: null = unset


def test_values_are_not_coerced():
    """A string "5" or a 1 for true is a mistake to name, not to guess at (cattrs would)."""
    values, errors, _ = normalize({"maxTokens": "5", "enable": 1, "debounceMs": 2.5,
                                   "preset": 3, "otherDocuments": "yes"})
    assert values == {} and len(errors) == 5


def test_ints_are_numbers_and_come_back_as_floats():
    values, errors, _ = normalize({"minConfidence": 1})
    assert values == {"min_confidence": 1.0} and isinstance(values["min_confidence"], float)
    assert not errors


def test_the_message_names_the_key_as_written_the_value_and_what_is_expected():
    _, errors, _ = normalize({"dtype": "float64", "logLevel": "loud", "maxTokens": 0,
                              "device": "tpu", "enable": "no"})
    assert errors == [
        "dtype: invalid value 'float64' (expected float16, bfloat16, float32)",
        "logLevel: invalid value 'loud' (expected debug, info, warning, error)",
        "maxTokens: invalid value 0 (expected 1 to 1024)",
        "device: invalid value 'tpu' (expected auto, cpu, mps, cuda or cuda:N)",
        "enable: invalid value 'no' (expected true or false)",
    ]


def test_one_bad_key_falls_back_alone():
    layers = SettingsLayers(cli={"max_tokens": 10})
    errors, _ = layers.set_init({"maxTokens": "many", "debounceMs": 5})
    s = layers.effective()
    assert len(errors) == 1 and (s.max_tokens, s.debounce_ms) == (10, 5)


def test_null_resets_an_optional_setting_and_leaves_a_required_one_to_the_layer_below():
    layers = SettingsLayers(cli={"preset": "tiny", "max_tokens": 10})
    layers.set_init({"preset": None, "maxTokens": None})
    s = layers.effective()
    assert s.preset is None and s.max_tokens == 10


def test_invalid_command_line_setting_is_reported():
    args = build_parser().parse_args(["serve", "--dtype", "float64", "--max-tokens", "9"])
    values, errors, _ = normalize(from_cli(args))
    assert values["max_tokens"] == 9 and "dtype" not in values
    assert errors == ["dtype: invalid value 'float64' (expected float16, bfloat16, float32)"]


def test_complete_with_an_invalid_model_flag_stops_with_the_message(capsys, tmp_path):
    from codespec_lsp.cli import main

    f = tmp_path / "a.py"
    f.write_text("x = 1\n")
    assert main(["complete", str(f), "--line", "0", "--col", "0", "--dtype", "float64"]) == 2
    assert "dtype: invalid value 'float64'" in capsys.readouterr().err
