"""Distil a self-speculation draft for smol: the target's first L layers, of which only the last
layer and the final norm are trained, toward the full target's greedy (argmax) token.

    OMP_NUM_THREADS=1 python scripts/train_smol_draft.py --layers 6 --head 8192 --minutes 12 \
        --json benchmarks/results/smol_draft_distil_cpu.json [--save DIR]

Data (stated, reproducible): the .py files of benchmarks/corpus and benchmarks/heldout (Python
standard library modules, PSF licence), cut into 256-token windows after a BOS, order shuffled
with seed 0; the labels are the full target's argmax at each position (teacher-forced on the real
text). The held-out measure is benchmarks/unseen_tune; benchmarks/unseen_check is never read.
The LM head stays the target's (tied to the embedding, frozen), cut to the `--head` ids most
frequent in the training files: the draft proposes only from those (lossless: verification is
the target's), and positions whose label lies outside are not trained on. One thread; the time
spent on labelling and on training is written to the JSON.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import time
from collections import Counter
from pathlib import Path

import torch

from codespec_lsp.engine import fetch
from codespec_lsp.engine.models import load_model, load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ("benchmarks/corpus", "benchmarks/heldout")
EVAL = "benchmarks/unseen_tune"


def windows(tokenizer, folders: list[str], size: int) -> list[list[int]]:
    files = sorted(p for f in folders for p in (ROOT / f).rglob("*.py"))
    out = []
    for path in files:
        ids = [tokenizer.bos_token_id] + tokenizer.encode(path.read_text(encoding="utf-8"),
                                                          add_special_tokens=False)
        out += [ids[s:s + size] for s in range(0, len(ids) - 16, size)]
    return out


@torch.inference_mode()
def teacher_labels(model, batches: list[list[int]]) -> list[torch.Tensor]:
    return [model(input_ids=torch.tensor([ids])).logits[0].argmax(-1) for ids in batches]


def draft_of(model, layers: int, subset: torch.Tensor) -> torch.nn.Module:
    """The first `layers` layers, the norm and the head cut to `subset`; only the last layer and
    the norm keep gradients."""
    draft = copy.deepcopy(model)
    draft.model.layers = draft.model.layers[:layers]
    draft.config.num_hidden_layers = layers
    head = torch.nn.Linear(draft.config.hidden_size, len(subset), bias=False)
    head.weight = torch.nn.Parameter(model.lm_head.weight[subset].detach().clone())
    draft.lm_head = head
    for p in draft.parameters():
        p.requires_grad_(False)
    for p in list(draft.model.layers[-1].parameters()) + list(draft.model.norm.parameters()):
        p.requires_grad_(True)
    return draft


def remap(labels: torch.Tensor, subset: torch.Tensor, vocab: int) -> torch.Tensor:
    """Target ids -> positions in the cut head; -100 (ignored) for ids outside it."""
    where = torch.full((vocab,), -100, dtype=torch.long)
    where[subset] = torch.arange(len(subset))
    return where[labels]


@torch.inference_mode()
def agreement(draft, batches: list[list[int]], labels: list[torch.Tensor], subset: torch.Tensor) -> float:
    hit = total = 0
    for ids, lab in zip(batches, labels):
        pick = subset[draft(input_ids=torch.tensor([ids])).logits[0].argmax(-1)]
        hit, total = hit + int((pick == lab).sum()), total + len(ids)
    return hit / total


def train(draft, data: list[tuple[list[int], torch.Tensor]], minutes: float, lr: float) -> dict:
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    draft.train()
    started, steps, losses, epoch = time.perf_counter(), 0, [], 0
    rng = random.Random(0)
    while time.perf_counter() - started < minutes * 60:
        order = list(range(len(data)))
        rng.shuffle(order)
        for i in order:
            ids, lab = data[i]
            logits = draft(input_ids=torch.tensor([ids])).logits[0]
            loss = torch.nn.functional.cross_entropy(logits, lab, ignore_index=-100)
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps, losses = steps + 1, losses + [float(loss)]
            if time.perf_counter() - started >= minutes * 60:
                break
        epoch += 1
        print(json.dumps({"epoch": epoch, "steps": steps, "loss": round(sum(losses[-50:]) / len(losses[-50:]), 4),
                          "s": round(time.perf_counter() - started)}), flush=True)
    draft.eval()
    return {"steps": steps, "epochs_started": epoch, "train_s": round(time.perf_counter() - started, 1),
            "final_loss": round(sum(losses[-50:]) / max(len(losses[-50:]), 1), 4)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--head", type=int, default=8192)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--minutes", type=float, default=12.0)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--eval-windows", type=int, default=40)
    ap.add_argument("--train-windows", type=int, default=150, help="after the seeded shuffle")
    ap.add_argument("--json", dest="json_path")
    ap.add_argument("--save", help="folder for the trained layer and norm (a state dict)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    folder = str(fetch.preset_dir("smol"))
    tok = load_tokenizer(folder)
    model = load_model(folder, device="cpu", dtype=torch.float32)
    train_windows = windows(tok, list(TRAIN), args.window)
    random.Random(0).shuffle(train_windows)
    train_windows = train_windows[:args.train_windows]
    counts = Counter(i for w in train_windows for i in w)
    subset = torch.tensor([i for i, _ in counts.most_common(args.head)], dtype=torch.long)
    eval_windows = windows(tok, [EVAL], args.window)[:args.eval_windows]
    t0 = time.perf_counter()
    train_labels = teacher_labels(model, train_windows)
    eval_labels = teacher_labels(model, eval_windows)
    label_s = time.perf_counter() - t0
    draft = draft_of(model, args.layers, subset)
    before = agreement(draft, eval_windows, eval_labels, subset)
    print(json.dumps({"label_s": round(label_s), "alpha_before": round(before, 4)}), flush=True)
    data = [(w, remap(lab, subset, model.config.vocab_size)) for w, lab in zip(train_windows, train_labels)]
    log = train(draft, data, args.minutes, args.lr)
    after = agreement(draft, eval_windows, eval_labels, subset)
    train_alpha = agreement(draft, train_windows[:args.eval_windows], train_labels[:args.eval_windows], subset)
    result = {"layers": args.layers, "head": args.head, "window": args.window, "lr": args.lr,
              "threads": 1, "train_data": list(TRAIN), "train_windows": len(train_windows),
              "train_tokens": sum(map(len, train_windows)), "eval_corpus": EVAL,
              "eval_tokens": sum(map(len, eval_windows)), "label_s": round(label_s, 1),
              "alpha_before": round(before, 4), "alpha_after": round(after, 4),
              "alpha_after_on_train": round(train_alpha, 4), **log}
    print(json.dumps(result, indent=2))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2) + "\n")
    if args.save:
        Path(args.save).mkdir(parents=True, exist_ok=True)
        trained = {f"layer.{k}": v for k, v in draft.model.layers[-1].state_dict().items()}
        trained.update({f"norm.{k}": v for k, v in draft.model.norm.state_dict().items()})
        torch.save({"layers": args.layers, "subset": subset, "state": trained}, Path(args.save) / "draft.pt")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
