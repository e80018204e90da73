"""The one pairing rule: can this draft speculate for this target?

Used by both `doctor` (which reports the check) and the loader (engine/models.py, which refuses a
pair with the same reason), so the two can never disagree about a pair. It lives in the engine because
the loader enforces it; the doctor (planning/) reads it from here.

The rule: the draft proposes ids that the target verifies, and the target's prompt ids are fed to
the draft, so every id must mean the same token on both sides. Concretely:
- the same vocabulary size: an id present on one side only either reaches a model that has no
  embedding for it (the target's infill ids fed to a Python-only draft) or is proposed to a target
  that cannot score it. "Only a few extra ids" is not harmless;
- every vocabulary entry maps to the same id (a 99.95 % agreement is two swapped tokens, which the
  target would reject every time they are drafted);
- the same bos / eos / unk ids (eos ends generation on both sides);
- the sample texts tokenize to the same ids (catches different merges over an equal vocabulary).

Two forms of the same rule: `compare_tokenizers` token by token (both tokenizers on disk) and
`compare_facts` on the recorded facts of the catalog (hub ids the doctor knows without the network).
An EAGLE head (engine/eagle.py) has no tokenizer of its own: it reads the target's hidden states
and uses its embedding and LM head, so its rule is `compare_eagle`, the target's shape.
Pure functions over tokenizer objects and dicts: no torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Code with indentation, tabs, f-strings, unicode, digits and CRLF: where the merges of two
# vocabularies diverge.
SAMPLE_TEXTS: tuple[str, ...] = (
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "import numpy as np\n\nx = np.zeros((3, 4), dtype=np.float32)\n",
    'class Config(dict):\n    """Settings."""\n\n\tname: str = "r\u00e9sum\u00e9"  # tab-indented\n',
    "for i in range(1024):\n    print(f'{i!r:>4} \u2211 \u65e5\u672c {i * 3.5e-2} \U0001f680')  # done\n",
    "x = [1, 22, 333, 4444, 55555] + {'key': None}\r\n",
)

SPECIAL_IDS = ("bos_token_id", "eos_token_id", "unk_token_id")

ADVICE = ("Speculative decoding needs a draft with the target's exact tokenizer, in practice a "
          "smaller model of the same family (e.g. CodeLlama-7B-Python for CodeLlama-13B-Python), "
          "or no draft model at all (n-gram drafting: --draft none).")


@dataclass(frozen=True)
class PairCheck:
    compatible: bool
    reason: str                                   # one line: why (not) — the loader's refusal reason
    details: list[str] = field(default_factory=list)

    def refusal(self, draft_name: str, target_name: str) -> str:
        """The loader's error message: the same reason the doctor reports, plus what to do."""
        return f"draft {draft_name} cannot speculate for target {target_name}: {self.reason}. {ADVICE}"


def compare_tokenizers(draft_tok, target_tok) -> PairCheck:
    """The rule, token by token, for two HF tokenizers."""
    vd, vt = draft_tok.get_vocab(), target_tok.get_vocab()
    size = max(len(vd), len(vt))
    agree = sum(1 for tok, i in vd.items() if vt.get(tok) == i)
    share_line = f"{agree / size:.2%} of the vocabulary agrees ({agree} of {size} tokens)"
    problems, details = [], [share_line]

    if len(draft_tok) != len(target_tok):
        problems.append(f"vocabulary sizes differ ({len(draft_tok)} vs {len(target_tok)})")
    if agree != size:
        problems.append(share_line)
        differing = sorted((i, tok) for tok, i in vd.items() if vt.get(tok) != i)[:5]
        problems.append("first differing: " + ", ".join(
            f"{tok!r} {i}->{vt.get(tok, 'absent')}" for i, tok in differing))
    specials = [f"{a} {getattr(draft_tok, a)} vs {getattr(target_tok, a)}" for a in SPECIAL_IDS
                if getattr(draft_tok, a) != getattr(target_tok, a)]
    if specials:
        problems.append("special ids differ: " + ", ".join(specials))

    sample_line = "sample texts tokenize identically"
    for text in SAMPLE_TEXTS:
        a = draft_tok.encode(text, add_special_tokens=False)
        b = target_tok.encode(text, add_special_tokens=False)
        if a != b:
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            sample_line = (f"sample texts tokenize differently: {text[:24]!r} from token {first} "
                           f"({a[first:first + 3]} vs {b[first:first + 3]})")
            problems.append(sample_line)
            break
    details.append(sample_line)
    details += [p for p in problems if p not in details]

    if problems:
        return PairCheck(False, "; ".join(problems), details)
    return PairCheck(True, "same ids for the same text", details)


def compare_facts(d: dict, t: dict, both_catalog: bool) -> PairCheck:
    """The same rule on recorded facts (class, vocabulary name and size, special ids), for models
    whose tokenizers are not both on disk. `both_catalog`: both facts come from the catalog, which
    names each vocabulary's lineage; otherwise one side is a local folder read for the same facts."""
    problems = []
    if both_catalog and d["family"] != t["family"]:
        problems.append(f"family {d['family']} vs {t['family']}")
    same_lineage = both_catalog and d.get("vocab") == t.get("vocab")
    if d.get("class") != t.get("class") and not same_lineage:
        problems.append(f"tokenizer {d.get('class')} vs {t.get('class')}")
    if both_catalog and not same_lineage:
        problems.append(f"different vocabularies ({d.get('vocab')} vs {t.get('vocab')})")
    if d["vocab_size"] != t["vocab_size"]:
        problems.append(f"vocabulary sizes differ ({d['vocab_size']} vs {t['vocab_size']})")
    for a in ("bos_token_id", "eos_token_id"):
        if d.get(a) != t.get(a):
            problems.append(f"{a} differs ({d.get(a)} vs {t.get(a)})")
    if problems:
        return PairCheck(False, ", ".join(problems), problems)
    if both_catalog:
        details = [f"same vocabulary ({d['vocab']}, {d['vocab_size']} ids, family {d['family']})"]
        if d.get("class") != t.get("class"):
            details.append(f"tokenizer classes differ in name only ({d.get('class')} vs {t.get('class')})")
        return PairCheck(True, details[0], details)
    return PairCheck(True, "same class, vocabulary size and special ids (recorded facts only)",
                     ["only one tokenizer is on disk, so ids were not compared token by token"])


EAGLE_IDENTITY = ("hidden_size", "vocab_size", "num_hidden_layers")


def eagle_identity(target_config: dict) -> dict:
    """What an EAGLE head records of the target it was trained for (config.json's "eagle")."""
    return {k: target_config.get(k) for k in EAGLE_IDENTITY}


def compare_eagle(head_config: dict, target_config: dict) -> PairCheck:
    """An EAGLE head's config.json against the target's config: the head pairs with the target it
    was trained for (its hidden states and vocabulary), and with no other."""
    wanted, have = head_config["eagle"]["target"], eagle_identity(target_config)
    if wanted != have:
        return PairCheck(False, f"the EAGLE head was trained for a target with {wanted}, not this one "
                                f"({have}): it reads the target's hidden states, so it only works with that target")
    return PairCheck(True, "an EAGLE head trained for this target: it reads the target's hidden states "
                           "and speaks its tokenizer")
