"""Train the embedded model pair (codespec_lsp/models/tiny/{target,draft}) from scratch, offline.

Data: the .py files of the running Python's standard library (PSF licence), minus its test
suites, minus the modules copied into benchmarks/corpus/ (the held-out set the benchmarks use)
and minus lib2to3 (benchmarks/heldout/ holds modules of it, for `bench quality`).
Steps, all seeded, so a rerun on the same Python gives the same models up to CPU float noise:
  1. a byte-level BPE tokenizer (4096 ids) shared by both models — one tokenizer is what makes
     the pair a valid speculative pair at all;
  2. the target, a 6-layer Llama, trained by next-token cross-entropy;
  3. the draft, a 2-layer Llama, distilled from the target (KL to the target's distribution plus
     a little cross-entropy), half on human-written windows and half on windows the target
     finished itself, so that its proposals are the ones the target accepts.

    python scripts/train_tiny.py --target-steps 320 --draft-steps 160
    python scripts/train_tiny.py --continue-target --target-steps 400 --draft-steps 160
    python scripts/train_tiny.py --continue-target --target-steps 650 --draft-steps 0
    python scripts/train_tiny.py --continue-target --target-steps 0 --draft-steps 300
    python scripts/train_tiny.py --continue-target --target-steps 1000 --target-lr 2e-3 --draft-steps 300
    python scripts/train_tiny.py --continue-target --target-steps 800 --target-lr 6e-4 --seq 2048 --batch 2 --draft-steps 0
    python scripts/train_tiny.py --continue-target --target-steps 800 --target-lr 6e-4 --seq 2048 --batch 2 --draft-steps 300 --continue-draft
    python scripts/train_tiny.py --continue-target --target-steps 800 --target-lr 4e-4 --seq 2048 --batch 2 --draft-steps 300 --continue-draft
    python scripts/train_tiny.py --continue-target --target-steps 1200 --target-lr 6e-4 --seq 2048 --batch 2 --draft-steps 300 --continue-draft --bf16
(a continued phase trains the saved target further and, unless --draft-steps 0, distils a fresh
draft from it, or with --continue-draft the saved one further; each phase draws its own windows,
seeded by how many phases came before; codespec_lsp/models/tiny/TRAINING.json records every phase
and its minutes). The last four phases train on 2048-token windows: the server's prompts reach
~1,500 tokens, and a model that only ever saw 512 positions lost a fifth of its accuracy past them.

--device cuda, --stdlib, --target-width/--target-layers and --target-minutes/--draft-minutes (a
schedule that follows the clock) are for training a bigger pair on a lent GPU in one call:
scripts/train_gpu.sh. --grow-layers N deepens the saved target before a continued phase
(grow_depth); tried once on CPU (docs/training.md) and not shipped.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import re
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from codespec_lsp import TINY_DIR
ROOT = Path(__file__).resolve().parent.parent
OUT = TINY_DIR
HELD_OUT = ROOT / "benchmarks" / "corpus"
SPECIAL = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}
VOCAB = 4096
SEQ = 512

TARGET = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=6,
              num_attention_heads=8, num_key_value_heads=4)
DRAFT = dict(hidden_size=192, intermediate_size=512, num_hidden_layers=2,
             num_attention_heads=6, num_key_value_heads=2)


def training_files(stdlib: Path | None = None) -> list[Path]:
    """The training .py files under `stdlib` (default: the running Python's standard library)."""
    stdlib = stdlib or Path(sysconfig.get_paths()["stdlib"])
    held_out = {p.name for p in HELD_OUT.glob("*.py")}
    # lib2to3 is held out: benchmarks/heldout/ (bench quality) is made of its modules.
    skip_dirs = {"site-packages", "test", "tests", "idle_test", "__pycache__", "lib2to3"}
    files = []
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib)
        if skip_dirs & set(rel.parts[:-1]) or (len(rel.parts) == 1 and path.name in held_out):
            continue
        files.append(path)
    return files


def read_texts(files: list[Path]) -> list[str]:
    texts = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if 200 < len(text) < 400_000:
            texts.append(text)
    return texts


def train_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token=SPECIAL["unk_token"]))
    # Byte-level so any source text round-trips exactly; no prefix space so that decode(encode(x)) == x.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=list(SPECIAL.values()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL, model_max_length=2048,
                                   clean_up_tokenization_spaces=False)


def target_shape(width: int, layers: int) -> dict:
    """A wider or deeper target in TARGET's proportions: MLP 3x the width, 32-wide heads, two
    query heads per KV head."""
    if width % 64:
        raise SystemExit(f"--target-width must be a multiple of 64, not {width}")
    heads = width // 32
    return dict(hidden_size=width, intermediate_size=3 * width, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=heads // 2)


def grow_depth(model: LlamaForCausalLM, layers: int) -> LlamaForCausalLM:
    """Deepen a trained Llama to `layers` without changing what it computes (LLaMA Pro's block
    expansion): each new layer is a copy of the one below it with its two residual outputs
    (attention o_proj, MLP down_proj) zeroed, so it adds nothing until training moves it, and it
    starts from weights that already read this model's hidden states. The copies are spread
    evenly up the stack. Training a wider or deeper model from scratch costs more CPU than a
    session has; growing the trained one keeps everything it learned."""
    old = list(model.model.layers)
    extra = layers - len(old)
    if extra <= 0:
        raise SystemExit(f"--grow-layers {layers}: the target already has {len(old)} layers")
    grown = []
    for i, layer in enumerate(old):
        grown.append(layer)
        for _ in range((i + 1) * extra // len(old) - i * extra // len(old)):
            twin = copy.deepcopy(layer)
            twin.self_attn.o_proj.weight.data.zero_()
            twin.mlp.down_proj.weight.data.zero_()
            grown.append(twin)
    for index, layer in enumerate(grown):
        layer.self_attn.layer_idx = index  # the KV cache is indexed by it
    model.model.layers = torch.nn.ModuleList(grown)
    model.config.num_hidden_layers = layers
    return model


def config_for(shape: dict, tokenizer: PreTrainedTokenizerFast) -> LlamaConfig:
    return LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=2048,
                       tie_word_embeddings=True, rope_theta=10000.0,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                       **shape)


def encode_stream(texts: list[str], tokenizer: PreTrainedTokenizerFast) -> torch.Tensor:
    ids: list[int] = []
    for text in texts:
        ids.append(tokenizer.bos_token_id)
        ids.extend(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def batches(stream: torch.Tensor, bos: int, batch: int, rng: random.Random, seq: int = SEQ):
    # Every window starts with BOS, as every prompt the engine builds does.
    while True:
        starts = [rng.randrange(0, len(stream) - seq) for _ in range(batch)]
        body = torch.stack([stream[s:s + seq - 1] for s in starts])
        yield torch.cat([torch.full((batch, 1), bos), body], dim=1)


def target_written_batches(target, texts: list[str], tokenizer, batch: int, rng: random.Random,
                           context: int = 256, written: int = 64):
    """Windows ending in `written` tokens the target wrote itself (greedy), from points where an
    editor asks for a completion: a line start, after its indentation. Distilling on these teaches
    the draft the text it is asked to draft at run time, not only human-written code
    (sequence-level distillation)."""
    bos = tokenizer.bos_token_id
    while True:
        prompts = []
        while len(prompts) < batch:
            text = rng.choice(texts)
            at = text.find("\n", rng.randrange(len(text))) + 1
            if at <= 0:
                continue
            at += len(text[at:at + 200]) - len(text[at:at + 200].lstrip(" \t"))
            if at >= len(text) or text[at] == "\n":
                continue
            ids = tokenizer(text[max(0, at - 8 * context):at], add_special_tokens=False)["input_ids"]
            if len(ids) >= context - 1:
                prompts.append([bos] + ids[-(context - 1):])
        seq = torch.tensor(prompts, device=target.device)
        cache = DynamicCache(config=target.config)
        with torch.no_grad():
            logits = target(seq, past_key_values=cache, use_cache=True).logits[:, -1]
            for _ in range(written):
                token = logits.argmax(-1, keepdim=True)
                seq = torch.cat([seq, token], dim=1)
                logits = target(token, past_key_values=cache, use_cache=True).logits[:, -1]
        yield seq


def alternate(*sources):
    while True:
        for source in sources:
            yield next(source)


def lr_at(step: int, total: int, peak: float, warmup: int = 40, done: float | None = None) -> float:
    """Linear warm-up, then a cosine down to 2 % of the peak over `done`, the share of the run
    behind us (default: of its steps)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    if done is None:
        done = (step - warmup) / max(1, total - warmup)
    return peak * 0.5 * (1 + math.cos(math.pi * min(done, 1.0))) + peak * 0.02


def autocast(bf16: bool, device: torch.device | str = "cpu"):
    """bf16 autocast: weights, optimizer state and the loss stay fp32; only the matmuls run in
    bf16, which CPUs with AVX-512 BF16 do about twice as fast (a whole training step: 1.5 s
    against 2.05 s in fp32 for 2 × 2048 tokens of the tiny target on 2 cores)."""
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16)


def line_start_ids(tokenizer) -> torch.Tensor:
    """[V] bool: the ids whose text ends in a newline and then only indentation. The token after
    one picks the statement a line starts with, where most completions are asked for and where
    the shipped pair lost the most (89 of 150 line starts shared no character with the real line)."""
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    return torch.tensor([bool(re.search(r"\n[ \t]*$", t)) for t in texts])


def train(model, data, steps: int, peak_lr: float, teacher=None, label: str = "",
          warmup: int = 40, bf16: bool = False, minutes: float | None = None,
          line_starts: torch.Tensor | None = None, line_start_weight: float = 1.0) -> int:
    """Train for `steps`, or with `minutes` until that time is up (`steps` then only caps it): the
    schedule follows the clock, so a run on a machine of unknown speed still anneals before its
    time runs out. With `line_starts` (line_start_ids), a token after one weighs
    `line_start_weight` in the cross-entropy (the logged `ce` stays the plain mean); only without
    a `teacher`: a distilled draft follows the target everywhere. Returns the steps run."""
    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    device = next(model.parameters()).device
    if line_starts is not None:
        line_starts = line_starts.to(device)  # once, not a host-to-device copy every step
    t0 = time.time()
    step = 0
    while step < steps:
        done = None
        if minutes is not None:
            elapsed = (time.time() - t0) / (60 * minutes)
            if elapsed >= 1.0:
                break
            done = max((step - warmup) / max(1, steps - warmup), elapsed)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, peak_lr, warmup, done)
        x = next(data).to(device)
        with autocast(bf16, device):
            logits = model(x[:, :-1]).logits.float()
        ce_each = F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1),
                                  reduction="none")
        ce = ce_each.mean()
        loss = ce
        if line_starts is not None and line_start_weight != 1.0:
            weight = 1 + (line_start_weight - 1) * line_starts[x[:, :-1]].reshape(-1).float()
            loss = (ce_each * weight).sum() / weight.sum()
        if teacher is not None:
            with torch.no_grad(), autocast(bf16, device):
                teacher_logp = F.log_softmax(teacher(x[:, :-1]).logits.float(), dim=-1)
            kl = F.kl_div(F.log_softmax(logits, dim=-1), teacher_logp, log_target=True,
                          reduction="batchmean") / x.size(1)
            loss = 0.8 * kl + 0.2 * ce
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0 or step == steps - 1:
            print(f"{label} step {step}/{steps} loss {loss.item():.3f} ce {ce.item():.3f} "
                  f"{time.time() - t0:.0f}s", flush=True)
        step += 1
    model.eval()
    return step


def save(model, tokenizer, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    # fp16 on disk keeps the pair under 25 MB; the loader upcasts to fp32 on CPU.
    model.to(torch.float16).save_pretrained(folder, safe_serialization=True)
    model.to(torch.float32)
    tokenizer.save_pretrained(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target-steps", type=int, default=320)
    parser.add_argument("--draft-steps", type=int, default=160)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", type=Path, default=OUT, help="where the pair is read and written")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--continue-target", action="store_true",
                        help="train the saved target --target-steps more (lower peak LR), then "
                             "distil a new draft from it")
    parser.add_argument("--target-lr", type=float, default=None,
                        help="peak LR for the target (default 3e-3 fresh, 1.5e-3 continued)")
    parser.add_argument("--seq", type=int, default=SEQ,
                        help="training window in tokens (the server's prompts reach ~1,500)")
    parser.add_argument("--warmup", type=int, default=40, help="linear LR warm-up steps")
    parser.add_argument("--target-minutes", type=float, default=None,
                        help="train the target this long (--target-steps then only caps it)")
    parser.add_argument("--draft-minutes", type=float, default=None,
                        help="distil the draft this long (--draft-steps then only caps it)")
    parser.add_argument("--continue-draft", action="store_true",
                        help="distil the saved draft further (peak LR 1.5e-3) instead of a fresh one")
    parser.add_argument("--bf16", action="store_true",
                        help="bf16 autocast for the forward passes (fp32 weights and loss)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda on a lent GPU")
    parser.add_argument("--stdlib", type=Path, default=None,
                        help="a CPython standard library folder to train on (default: the running "
                             "Python's; scripts/train_gpu.sh carries 3.11's to a machine with 3.12)")
    parser.add_argument("--target-width", type=int, default=TARGET["hidden_size"],
                        help="a fresh target's width (default 256)")
    parser.add_argument("--target-layers", type=int, default=TARGET["num_hidden_layers"],
                        help="a fresh target's depth (default 6)")
    parser.add_argument("--line-start-weight", type=float, default=1.0,
                        help="the target's cross-entropy weight on a line's first token after its "
                             "indentation (line_start_ids; default 1: every token alike)")
    parser.add_argument("--grow-layers", type=int, default=None,
                        help="with --continue-target: deepen the saved target to this many layers "
                             "first (grow_depth), then train it")
    args = parser.parse_args()
    if args.grow_layers and not args.continue_target:
        parser.error("--grow-layers deepens the saved target: use it with --continue-target")
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)

    t_start = time.time()
    texts = read_texts(training_files(args.stdlib))
    print(f"{len(texts)} files, {sum(map(len, texts)) / 1e6:.1f} MB of Python", flush=True)
    record_path = args.out / "TRAINING.json"
    if args.continue_target:
        record = json.loads(record_path.read_text())
        tokenizer = PreTrainedTokenizerFast.from_pretrained(args.out / "target")
        target = LlamaForCausalLM.from_pretrained(args.out / "target", dtype=torch.float32).to(args.device)
        peak_lr = args.target_lr or 1.5e-3
        if args.grow_layers:
            grow_depth(target, args.grow_layers)
    else:
        record = {"phases": []}
        tokenizer = train_tokenizer(texts)
        shape = target_shape(args.target_width, args.target_layers)
        target = LlamaForCausalLM(config_for(shape, tokenizer)).to(args.device)
        peak_lr = args.target_lr or 3e-3
    # Each phase draws other windows than the phases before it.
    rng = random.Random(args.seed + len(record["phases"]))
    stream = encode_stream(texts, tokenizer)
    print(f"{len(stream) / 1e6:.2f} M tokens, {time.time() - t_start:.0f}s", flush=True)

    target_run = draft_run = 0
    if args.target_steps:
        target_run = train(target, batches(stream, tokenizer.bos_token_id, args.batch, rng, args.seq),
                           args.target_steps, peak_lr, label="target", warmup=args.warmup,
                           bf16=args.bf16, minutes=args.target_minutes,
                           line_starts=line_start_ids(tokenizer) if args.line_start_weight != 1.0 else None,
                           line_start_weight=args.line_start_weight)
        save(target, tokenizer, args.out / "target")
    target_minutes = (time.time() - t_start) / 60

    if args.draft_steps:
        if args.continue_draft:
            draft = LlamaForCausalLM.from_pretrained(args.out / "draft", dtype=torch.float32)
        else:
            draft = LlamaForCausalLM(config_for(DRAFT, tokenizer))
        draft.to(args.device)
        target.requires_grad_(False)
        # Half the steps on human-written windows, half on windows the target finished itself.
        data = alternate(batches(stream, tokenizer.bos_token_id, args.batch, rng, args.seq),
                         target_written_batches(target, texts, tokenizer, args.batch, rng))
        draft_run = train(draft, data, args.draft_steps, 1.5e-3 if args.continue_draft else 4e-3,
                          teacher=target, label="draft", warmup=args.warmup, bf16=args.bf16,
                          minutes=args.draft_minutes)
        save(draft, tokenizer, args.out / "draft")

    record.update({
        "data": "CPython standard library .py files (PSF licence), tests, lib2to3 and held-out modules excluded",
        "python": (args.stdlib.name.removeprefix("python") if args.stdlib else sysconfig.get_python_version()),
        "files": len(texts), "tokens": len(stream),
        "seed": args.seed, "threads": args.threads,
    })
    record["phases"].append({
        "command": "continue" if args.continue_target else "fresh",
        "batch": args.batch, "seq": args.seq,
        "warmup": args.warmup, "continue_draft": args.continue_draft, "bf16": args.bf16,
        **({"grow_layers": args.grow_layers} if args.grow_layers else {}),
        **({"line_start_weight": args.line_start_weight} if args.line_start_weight != 1.0 else {}),
        "device": torch.device(args.device).type,
        "target_steps": target_run, "target_peak_lr": peak_lr,
        "draft_steps": draft_run,
        "target_minutes": round(target_minutes, 1),
        "draft_minutes": round((time.time() - t_start) / 60 - target_minutes, 1),
    })
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"done in {(time.time() - t_start) / 60:.1f} min", flush=True)


if __name__ == "__main__":
    main()
