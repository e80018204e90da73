"""Exercise the GPTQ path for real, on CPU: quantize the embedded pair, load it back through the
project's own loader, and check that speculative decoding is still lossless.

The default CUDA preset (`codellama-python-gptq`) loads GPTQ checkpoints through transformers' GPTQ
integration (optimum + gptqmodel). This script runs that same path on the embedded tiny pair:

  1. quantize codespec_lsp/models/tiny/{target,draft} to GPTQ 4-bit with gptqmodel, on CPU,
     calibrated on windows of the training corpus (the standard library files the pair was
     trained on, never benchmarks/corpus);
  2. load both folders with `codespec_lsp.engine.load_engine(target=..., draft=...)`, i.e. plain
     `AutoModelForCausalLM.from_pretrained`, exactly as a user with the `gptq` extra would;
  3. check, on prompts from the held-out corpus, that greedy speculative output equals the
     quantized target's own greedy output token for token (and report acceptance).

Needs the `gptq` extra, which pulls a CUDA torch of several GB: run it in a separate venv, e.g.

    python -m venv /work/gptq-venv
    /work/gptq-venv/bin/pip install -e '.[gptq]'
    /work/gptq-venv/bin/python scripts/quantize_gptq.py --out /tmp/tiny-gptq

Exit status 0 only when every prompt matched. A JSON report is written to OUT/report.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from train_tiny import read_texts, training_files  # noqa: E402  (the pair's own training corpus)

from codespec_lsp import TINY_DIR  # noqa: E402

HELD_OUT = ROOT / "benchmarks" / "corpus"
# gptqmodel 7.7 sizes its CPU pool as (cores + 1) // 2 and then asks for 2 loader workers: on a
# 2-core machine that is "requests 2 workers but parent 'cpu' only has 1" at GPTQModel.load.
os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def calibration(tokenizer, n: int, seq_len: int, seed: int = 0) -> list[dict]:
    """`n` windows of `seq_len` tokens from the training corpus, seeded."""
    rng = random.Random(seed)
    texts = read_texts(training_files())
    windows = []
    while len(windows) < n:
        ids = tokenizer.encode(rng.choice(texts), add_special_tokens=False)
        if len(ids) <= seq_len:
            continue
        start = rng.randrange(len(ids) - seq_len)
        window = ids[start:start + seq_len]
        windows.append({"input_ids": window, "attention_mask": [1] * len(window)})
    return windows


def quantize(role: str, out: Path, args) -> dict:
    from gptqmodel import GPTQModel, QuantizeConfig
    from transformers import AutoTokenizer

    src, dst = TINY_DIR / role, out / role
    tok = AutoTokenizer.from_pretrained(src)
    # group_size 64: the draft's hidden size (192) is no multiple of the usual 128.
    config = QuantizeConfig(bits=args.bits, group_size=args.group_size, desc_act=False)
    start = time.perf_counter()
    model = GPTQModel.load(str(src), config, device="cpu")
    model.quantize(calibration(tok, args.samples, args.seq_len), batch_size=1)
    if dst.exists():
        shutil.rmtree(dst)
    model.save(str(dst))
    for name in TOKENIZER_FILES + ("generation_config.json",):
        if not (dst / name).exists() and (src / name).exists():
            shutil.copy(src / name, dst / name)
    seconds = time.perf_counter() - start
    size = sum(f.stat().st_size for f in dst.rglob("*") if f.is_file())
    return {"role": role, "seconds": round(seconds, 1), "bytes": size,
            "source_bytes": sum(f.stat().st_size for f in src.rglob("*") if f.is_file())}


def prompts(n: int, chars: int) -> list[str]:
    """Prefixes of the held-out files, cut at a line end: what a user's buffer looks like."""
    out = []
    for path in sorted(HELD_OUT.glob("*.py"))[:n]:
        text = path.read_text(encoding="utf-8")
        cut = text.rfind("\n", 0, chars)
        out.append(text[:cut + 1])
    return out


def check(out: Path, args) -> dict:
    import torch

    from codespec_lsp.completion.complete import run
    from codespec_lsp.engine import load_engine

    torch.manual_seed(0)
    start = time.perf_counter()
    engine = load_engine(target=str(out / "target"), draft=str(out / "draft"), device="cpu",
                         dtype=args.dtype)
    load_s = time.perf_counter() - start
    if args.k:
        engine.fixed_k = args.k  # pinned so the check verifies drafts at every step
    quantized = sorted({type(m).__name__ for m in engine.target_model.modules()
                        if type(m).__module__.startswith("gptqmodel")})
    cases, all_equal = [], True
    for prompt in prompts(args.prompts, args.prompt_chars):
        ids = engine.encode(prompt)
        engine.reset_caches()
        plain = run(engine.generate(ids, max_new_tokens=args.tokens, speculative=False))
        engine.reset_caches()
        spec = run(engine.generate(ids, max_new_tokens=args.tokens, speculative=True, drafter="model"))
        # transformers' own greedy decoding of the quantized target: a reference outside the engine.
        with torch.no_grad():
            out = engine.target_model.generate(torch.tensor([ids]), max_new_tokens=args.tokens,
                                               do_sample=False, pad_token_id=engine.tokenizer.eos_token_id)
        hf = out[0, len(ids):].tolist()[:len(plain.tokens)]
        equal = spec.tokens == plain.tokens == hf
        all_equal &= equal
        cases.append({"prompt_tokens": len(ids), "tokens": len(plain.tokens), "equal": equal,
                      "equal_to_hf_generate": plain.tokens == hf,
                      "accepted": spec.accepted, "proposed": spec.proposed,
                      "target_forwards_speculative": spec.target_forwards,
                      "target_forwards_plain": plain.target_forwards,
                      "wall_s_plain": round(plain.wall_s, 3), "wall_s_speculative": round(spec.wall_s, 3)})
        print(f"prompt {len(cases)}: {len(plain.tokens)} tokens, equal={equal}, "
              f"accepted {spec.accepted}/{spec.proposed}", flush=True)
    return {"load_s": round(load_s, 2), "quantized_modules": quantized,
            "quantization_config": engine.target_model.config.quantization_config.to_dict()
            if hasattr(engine.target_model.config.quantization_config, "to_dict")
            else engine.target_model.config.quantization_config,
            "all_equal": all_equal, "cases": cases}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/codespec-tiny-gptq"))
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--samples", type=int, default=64, help="calibration windows")
    ap.add_argument("--seq-len", type=int, default=256, help="tokens per calibration window")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-chars", type=int, default=1200)
    ap.add_argument("--tokens", type=int, default=48, help="new tokens per prompt")
    ap.add_argument("--dtype", default=None, help="dtype to load the quantized pair in (default: the "
                    "loader's choice, float32 on CPU)")
    ap.add_argument("--k", type=int, default=4, help="pin K drafted tokens per step, so that every "
                    "step verifies drafts (0: the engine's adaptive K)")
    ap.add_argument("--skip-quantize", action="store_true", help="only load and check OUT")
    args = ap.parse_args(argv)

    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    os.chdir(args.out)  # gptqmodel writes its quantization logs to ./logs
    report: dict = {"args": {k: str(v) for k, v in vars(args).items()}}
    if not args.skip_quantize:
        report["quantize"] = [quantize(role, args.out, args) for role in ("target", "draft")]
        print(json.dumps(report["quantize"]), flush=True)
    report["check"] = check(args.out, args)
    (args.out / "report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report["check"].items() if k != "cases"}, indent=2))
    return 0 if report["check"]["all_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
