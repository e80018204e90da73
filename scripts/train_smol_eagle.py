"""Train the smol preset's draft: a one-layer EAGLE head (codespec_lsp/engine/eagle.py) that reads
the target's last hidden state and the next token and predicts the target's next hidden state.

    python scripts/train_smol_eagle.py collect --minutes 30 --out /tmp/eagle_data.pt
    python scripts/train_smol_eagle.py train --data /tmp/eagle_data.pt --minutes 40 \
        --save codespec_lsp/models/smol_eagle --json benchmarks/results/smol_eagle_train_cpu.json

The shipped head took three collections and three training runs (the exact commands are in
benchmarks/results/smol_eagle_train_cpu.json, "commands"): two on the first data set below, then
one continuing from that head on the second.

Data (stated, reproducible for a given Python and the versions pinned in pyproject.toml). First
set (the `collect` defaults): the .py files of the Python standard library (no tests, no lib2to3:
it is `benchmarks/heldout`) and of these installed packages: transformers, huggingface_hub,
pydantic, httpx, rich, typer, pygls, lsprotocol, anyio, cattrs, click, jinja2, requests, numpy.
Second set (`--no-stdlib --packages _pytest,hypothesis,accelerate,websockets --dirs ...`): those
installed packages and the sources of three packages released after the target was trained,
fetched as sdists (`pip download --no-deps --no-binary :all: openai-agents==0.24.0
claude-agent-sdk==0.2.189 gepa==0.1.4`, unpacked): openai_agents src/ and examples/,
claude_agent_sdk src/ and examples/, gepa src/. Their tests are skipped everywhere.
Files are read in sorted order, cut into 512-token windows after a BOS, and the windows shuffled
with seed 0; `collect` runs the target over as many as its time allows and keeps, per position,
the target's final hidden state (fp16) and its greedy next token. benchmarks/unseen_tune is the
held-out measure (`train` reports the head's agreement there); benchmarks/unseen_check is never
read.
"""

from __future__ import annotations

import argparse
import json
import random
import sysconfig
import time
from collections import Counter
from pathlib import Path

import torch

from codespec_lsp.engine import fetch
from codespec_lsp.engine.models import load_model, load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("transformers", "huggingface_hub", "pydantic", "httpx", "rich", "typer", "pygls",
            "lsprotocol", "anyio", "cattrs", "click", "jinja2", "requests", "numpy")
EVAL = "benchmarks/unseen_tune"
WINDOW = 512


def training_files(packages: tuple[str, ...] = PACKAGES, dirs: tuple[str, ...] = (),
                   stdlib: bool = True) -> list[Path]:
    skip = {"test", "tests", "lib2to3", "idlelib", "site-packages", "__pycache__", "ensurepip"}
    files = []
    if stdlib:
        lib = Path(sysconfig.get_paths()["stdlib"])
        files += [p for p in lib.rglob("*.py") if not set(p.relative_to(lib).parts) & skip]
    site = Path(sysconfig.get_paths()["purelib"])
    for name in packages:
        files += [p for p in (site / name).rglob("*.py") if "tests" not in p.parts]
    for folder in map(Path, dirs):
        files += [p for p in folder.rglob("*.py") if not set(p.relative_to(folder).parts) & skip]
    return sorted(files)


def sources_of(packages: tuple[str, ...], dirs: tuple[str, ...], stdlib: bool) -> list[str]:
    """What training_files(packages, dirs, stdlib) reads, as a collection records it."""
    return ((["python stdlib " + sysconfig.get_python_version()] if stdlib else []) + list(packages)
            + ["/".join(Path(d).parts[-2:]) for d in dirs])


def windows_of(tokenizer, files: list[Path], size: int = WINDOW) -> list[list[int]]:
    out = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        ids = [tokenizer.bos_token_id] + tokenizer.encode(text, add_special_tokens=False, verbose=False)
        out += [ids[s:s + size] for s in range(0, len(ids) - 64, size)]
    return out


@torch.inference_mode()
def target_features(model, batch: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Final hidden states [B, T, H] and greedy next tokens [B, T] (equal-length windows)."""
    hidden = model.model(input_ids=torch.tensor(batch)).last_hidden_state
    return hidden, model.lm_head(hidden).argmax(-1)


def collect(args) -> None:
    torch.set_num_threads(args.threads)
    folder = fetch.preset_dir("smol")
    tokenizer, model = load_tokenizer(str(folder)), load_model(str(folder), device="cpu", dtype=torch.float32)
    model.eval()
    chosen = (tuple(args.packages.split(",")) if args.packages else (),
              tuple(args.dirs.split(",")) if args.dirs else (), not args.no_stdlib)
    files = training_files(*chosen)
    wins = [w for w in windows_of(tokenizer, files) if len(w) == WINDOW]
    random.Random(0).shuffle(wins)
    wins = wins[args.skip:]  # a second run continues where an earlier one stopped
    print(f"{len(wins)} windows of {WINDOW} tokens available", flush=True)
    ids, feats, labels = [], [], []
    started = time.perf_counter()
    for start in range(0, len(wins), args.batch):
        batch = wins[start:start + args.batch]
        hidden, greedy = target_features(model, batch)
        ids.append(torch.tensor(batch, dtype=torch.int32))
        feats.append(hidden.half())
        labels.append(greedy.int())
        spent = time.perf_counter() - started
        if len(ids) % 10 == 0:
            print(f"{sum(len(i) for i in ids)} windows in {spent:.0f} s", flush=True)
        if spent > args.minutes * 60:
            break
    data = {"ids": torch.cat(ids), "features": torch.cat(feats), "labels": torch.cat(labels),
            "seconds": time.perf_counter() - started, "window": WINDOW, "files": len(files),
            "sources": sources_of(*chosen)}
    torch.save(data, args.out)
    print(f"saved {len(data['ids'])} windows ({data['ids'].numel()} tokens) to {args.out}")


def eval_windows(tokenizer) -> list[list[int]]:
    files = sorted((ROOT / EVAL).rglob("*.py"))
    return [w for w in windows_of(tokenizer, files) if len(w) >= 64]


def losses(head, ids, features, labels, noise: float) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Regression to the next hidden state plus cross-entropy toward the target's greedy token,
    teacher-forced: the entry at position j reads token j and the target's hidden state at j - 1."""
    inputs = features[:, :-1].float()
    if noise:
        inputs = inputs + noise * inputs.std() * torch.randn_like(inputs)
    predicted = head(ids[:, 1:].long(), inputs)
    wanted = features[:, 1:].float()
    regression = torch.nn.functional.smooth_l1_loss(predicted, wanted)
    logits = head.logits(predicted)
    where = head.position_of(labels[:, 1:].long())
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), where.flatten(), ignore_index=-100)
    hit = int(((logits.argmax(-1) == where) & (where >= 0)).sum())
    return regression, ce, hit, where.numel()


def train(args) -> None:
    from codespec_lsp.engine.eagle import EagleHead, load_head, save_head

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    folder = fetch.preset_dir("smol")
    tokenizer, target = load_tokenizer(str(folder)), load_model(str(folder), device="cpu", dtype=torch.float32)
    parts = [torch.load(path) for path in args.data.split(",")]
    data = {k: torch.cat([p[k] for p in parts]) for k in ("ids", "features", "labels")}
    default = sources_of(PACKAGES, (), True)  # collections that predate "sources" read the defaults
    data.update(seconds=sum(p["seconds"] for p in parts), window=parts[0]["window"],
                files=[p["files"] for p in parts],  # per collection: two may read the same files
                sources=sorted({s for p in parts for s in p.get("sources", default)}))
    counts = Counter(data["labels"].flatten().tolist())
    head_ids = torch.tensor(sorted(t for t, _ in counts.most_common(args.head)))
    coverage = sum(c for t, c in counts.most_common(args.head)) / data["labels"].numel()
    if args.init:  # continue from a saved head (its ids, not this data's most frequent)
        head = load_head(args.init, target).train()
        head_ids = head.head_ids
        coverage = sum(counts[int(t)] for t in head_ids) / data["labels"].numel()
    else:
        head = EagleHead.for_target(target, head_ids)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    # held-out windows, labelled by the target once
    held = eval_windows(tokenizer)[:args.eval_windows]
    held_feats = [target_features(target, [w]) for w in held]
    n = len(data["ids"])
    started, step, log = time.perf_counter(), 0, []

    def evaluate() -> float:
        head.eval()
        hit = total = 0
        with torch.no_grad():
            for w, (hidden, greedy) in zip(held, held_feats):
                _, _, h, t = losses(head, torch.tensor([w]), hidden, greedy, 0.0)
                hit, total = hit + h, total + t
        head.train()
        return hit / max(total, 1)

    before = evaluate()
    print(f"held-out agreement before: {before:.3f}; head covers {coverage:.3f} of labels", flush=True)
    total_steps = args.steps
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=total_steps,
                                                   pct_start=0.05)
    while step < total_steps and time.perf_counter() - started < args.minutes * 60:
        order = torch.randperm(n)
        for start in range(0, n - args.batch + 1, args.batch):
            pick = order[start:start + args.batch]
            regression, ce, hit, total = losses(head, data["ids"][pick], data["features"][pick],
                                                data["labels"][pick], args.noise)
            loss = regression + args.ce_weight * ce
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            schedule.step()
            step += 1
            if step % 50 == 0:
                entry = {"step": step, "seconds": round(time.perf_counter() - started),
                         "regression": round(regression.item(), 4), "ce": round(ce.item(), 4),
                         "train_agreement": round(hit / total, 4)}
                if step % 400 == 0:
                    entry["held_out_agreement"] = round(evaluate(), 4)
                log.append(entry)
                print(entry, flush=True)
            if step >= total_steps or time.perf_counter() - started > args.minutes * 60:
                break
    after = evaluate()
    print(f"held-out agreement after: {after:.3f}", flush=True)
    if args.save:
        save_head(head, Path(args.save), target_folder=folder)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "data": {"windows": n, "tokens": int(data["ids"].numel()), "window": data["window"],
                     "collect_seconds": round(data["seconds"]), "files": data["files"],
                     "sources": data["sources"]},
            "head": {"ids": args.head, "label_coverage": round(coverage, 4)},
            "train": {"init": args.init, "steps": step, "seconds": round(time.perf_counter() - started), "batch": args.batch,
                      "lr": args.lr, "noise": args.noise, "ce_weight": args.ce_weight,
                      "threads": args.threads},
            "held_out": {"corpus": EVAL, "windows": len(held), "positions": sum(len(w) - 1 for w in held),
                         "agreement_before": round(before, 4), "agreement_after": round(after, 4)},
            "log": log}, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--minutes", type=float, default=30)
    c.add_argument("--batch", type=int, default=4)
    c.add_argument("--threads", type=int, default=2)
    c.add_argument("--out", default="/tmp/eagle_data.pt")
    c.add_argument("--skip", type=int, default=0, help="shuffled windows an earlier run took")
    c.add_argument("--packages", default=",".join(PACKAGES), help="installed packages to read")
    c.add_argument("--dirs", default="", help="source folders to read, comma-separated")
    c.add_argument("--no-stdlib", action="store_true")
    t = sub.add_parser("train")
    t.add_argument("--data", default="/tmp/eagle_data.pt", help="one or more collect outputs, comma-separated")
    t.add_argument("--minutes", type=float, default=40)
    t.add_argument("--steps", type=int, default=4000)
    t.add_argument("--batch", type=int, default=8)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--noise", type=float, default=0.05)
    t.add_argument("--ce-weight", type=float, default=0.1)
    t.add_argument("--head", type=int, default=8192)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--eval-windows", type=int, default=12)
    t.add_argument("--init", default=None, help="a head folder to continue training from")
    t.add_argument("--save", default=None)
    t.add_argument("--json", default=None)
    args = parser.parse_args()
    collect(args) if args.command == "collect" else train(args)


if __name__ == "__main__":
    main()
