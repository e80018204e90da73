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
