"""`codespec-lsp` entry point: serve (default, stdio), complete, fetch, bench, doctor.

Each subcommand parses its flags here and hands plain values to the module that does the work,
so every module stays importable and testable without argparse.
"""

from __future__ import annotations

import argparse
import os
import sys


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", help="model preset: smol (the CPU default, after `codespec-lsp fetch "
                                    "smol`), tiny, codellama-python, codellama-python-gptq")
    p.add_argument("--draft", help="draft model: hub id, local folder or .gguf file, or none "
                                   "(overrides the preset)")
    p.add_argument("--target", help="target model: hub id, local folder or .gguf file "
                                    "(overrides the preset)")
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cuda, cuda:N or cpu")
    p.add_argument("--dtype", default=None, help="float16, bfloat16 or float32 (default: by device)")
    p.add_argument("--allow-download", action="store_true",
                   help="let transformers fetch missing checkpoints from the hub (off: offline only)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="run model code shipped with a checkpoint (off unless you set it)")
    p.add_argument("--exact", action="store_true",
                   help="exactly the target's output: no copy prior, no name lean (setting exact)")


def _add_remote_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--remote", default=None, metavar="URL",
                   help="complete with an OpenAI-compatible server (e.g. http://127.0.0.1:8000/v1)")
    p.add_argument("--remote-model", default=None, help="model name on the server (default: its first)")
    p.add_argument("--api-key-env", default=None, metavar="VAR",
                   help="environment variable holding the server's API key")


def _flags(p: argparse.ArgumentParser, *specs: tuple) -> argparse.ArgumentParser:
    """Each spec: (flag, ...) or (flag, ..., {keyword arguments of add_argument})."""
    for spec in specs:
        kw = spec[-1] if isinstance(spec[-1], dict) else {}
        p.add_argument(*(spec[:-1] if kw else spec), **kw)
    return p


def _serve_parser(sub) -> None:
    serve = sub.add_parser("serve", help="speak LSP (stdio unless --tcp/--ws)")
    _add_model_flags(serve)
    _flags(serve,
           ("--tcp", {"action": "store_true", "help": "listen on TCP instead of stdio (one session per connection)"}),
           ("--ws", {"action": "store_true", "help": "listen on WebSocket instead of stdio (one session per connection)"}),
           ("--host", {"default": "127.0.0.1", "help": "address for --tcp/--ws (default 127.0.0.1)"}),
           ("--port", {"type": int, "default": 2087}),
           ("--allow-origin", {"action": "append", "default": [], "metavar": "ORIGIN",
                               "help": "--ws: let browser pages from ORIGIN connect (repeatable; "
                                       "default: none, a handshake with an Origin header gets 403)"}),
           ("--max-tokens", {"type": int, "default": None}),
           ("--debounce-ms", {"type": int, "default": None}),
           ("--time-budget-ms", {"type": int, "default": None,
                                 "help": "show what is written after this long, the rest by typing-through (0: off)"}),
           ("--context-tokens", {"type": int, "default": None, "help": "prefix token budget"}),
           ("--log-file", {"default": None, "help": "also write the log here"}),
           ("--log-level", {"default": None, "choices": ["debug", "info", "warning", "error"],
                            "help": "debug adds one line per request (default info; setting logLevel)"}))
    _add_remote_flags(serve)


def _complete_parser(sub) -> None:
    complete = sub.add_parser("complete", help="complete one position of a file and print the text")
    complete.add_argument("file")
    _flags(complete, ("--line", {"type": int, "required": True, "help": "0-based line"}),
           ("--col", {"type": int, "required": True, "help": "0-based column (characters)"}))
    _add_model_flags(complete)
    _flags(complete,
           ("--no-speculative", {"action": "store_true", "help": "target alone, no drafting"}),
           ("--drafter", {"default": "auto", "choices": ["auto", "model", "ngram", "combined"]}),
           ("--max-tokens", {"type": int, "default": 64}),
           ("--temperature", {"type": float, "default": 0.0}),
           ("--top-p", {"type": float, "default": 1.0}),
           ("--json", {"action": "store_true", "help": "print text plus the engine's counts"}))
    _add_remote_flags(complete)


def _bench_parsers(sub) -> None:
    bench_sub = sub.add_parser("bench", help="benchmarks that write JSON").add_subparsers(
        dest="bench_command", required=True)
    corpus = ("--corpus", {"default": None, "help": "folder of .py files (default: held-out set)"})
    json_path = ("--json", {"dest": "json_path", "default": None, "help": "write the JSON here"})
    be = bench_sub.add_parser("engine", help="target-only vs speculative, cache replay, cancel latency")
    _add_model_flags(be)
    _flags(be, corpus, ("--points", {"type": int, "default": 24}),
           ("--max-tokens", {"type": int, "default": 48}), json_path,
           ("--fixed-k", {"type": int, "default": None,
                          "help": "pin K instead of adapting it (shows what drafting at a loss buys)"}))
    bs = bench_sub.add_parser("server", help="replay typing against the real server over stdio")
    _add_model_flags(bs)
    _flags(bs, corpus, ("--interval-ms", {"type": int, "default": 100}),
           ("--keystrokes", {"type": int, "default": 2000}),
           ("--debounce-ms", {"type": int, "default": None, "help": "server debounce (default: its own)"}),
           ("--max-tokens", {"type": int, "default": None, "help": "server max tokens (default: its own)"}),
           ("--time-budget-ms", {"type": int, "default": None, "help": "server time budget (default: its own)"}),
           ("--pause-ms", {"type": int, "default": None,
                           "help": "pause this long at each line's start (after Enter and its indentation)"}),
           json_path)
    _add_remote_flags(bs)
    _flags(bs, ("--clients", {"default": None, "help": "N editors typing at once (or a sweep: 1,2,4), each its own server"}),
           ("--tcp", {"action": "store_true", "help": "with --clients: one `serve --tcp` server, one connection per editor"}),
           ("--soak", {"action": "store_true", "help": "soak: type into --documents open files with cancels; report every "
                                                       "answer, the documents' text and the server's RSS over time"}),
           ("--documents", {"type": int, "default": 5, "help": "--soak: files open at once"}))
    bq = bench_sub.add_parser("quality", help="score suggestions against held-out code")
    _add_model_flags(bq)
    _flags(bq, corpus, ("--points", {"type": int, "default": 40}), json_path,
           ("--min-confidence", {"type": float, "default": None,
                                 "help": "the confidence gate's threshold, a probability 0..1 (default: the model's)"}),
           ("--copy-weight", {"type": float, "default": None,
                              "help": "the copy prior's share in the scores, 0..1 (default: the model's)"}),
           ("--sweep", {"default": None, "help": "comma-separated thresholds to score too, from the same generations"}),
           ("--workspace-root", {"action": "store_true",
                                 "help": "the corpus folder is the workspace, as an editor opened on it (the "
                                         "workspace context may read its other files)"}),
           ("--workspace-context", {"choices": ["true", "false"], "default": None,
                                    "help": "the workspaceContext setting (default: the server's)"}))
    bc = bench_sub.add_parser("context", help="score lines that use a sibling module's name, "
                                              "with and without workspace context")
    _add_model_flags(bc)
    _flags(bc, ("--package", {"default": None, "help": "package folder (default: benchmarks/context/sample)"}),
           ("--points", {"type": int, "default": 40}), json_path,
           ("--copy-weight", {"type": float, "default": None,
                              "help": "the copy prior's share in the scores, 0..1 (default: the model's)"}))


def _doctor_parser(sub) -> None:
    doctor = sub.add_parser("doctor", help="will this draft/target pair fit and speed up?")
    _flags(doctor, ("--draft", {"required": True}), ("--target", {"required": True}),
           ("--gpu-mem", {"default": "24GiB"}), ("--context", {"type": int, "default": 4096}),
           ("--k", {"type": int, "default": None}), ("--acceptance", {"type": float, "default": None}),
           ("--cost-ratio", {"type": float, "default": None,
                             "help": "draft forward time / target forward time measured on your card "
                                     "(scripts/gpu_bench.py's cost_ratio); default: from bytes read"}),
           ("--json", {"action": "store_true"}),
           ("--launch", {"choices": ["vllm", "llama-server"], "default": None,
                         "help": "print the command that serves this pair with speculation on that server"}))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="codespec-lsp", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    _serve_parser(sub)
    _complete_parser(sub)
    fetch = sub.add_parser("fetch", help="download and convert a preset's model once (e.g. smol)")
    _flags(fetch, ("name", {"help": "the preset: smol"}),
           ("--json", {"action": "store_true", "help": "print preset, path, bytes as JSON"}),
           ("--force", {"action": "store_true", "help": "download and convert again"}))
    _bench_parsers(sub)
    _doctor_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["serve", *argv]  # `codespec-lsp --preset tiny` is how editors start a server
    args = parser.parse_args(argv)
    if args.command in ("complete", "bench"):
        # No editor to show a message to: a bad model flag (`--dtype float64`) stops here,
        # named (the server instead shows it to the editor and serves on with the default).
        # Model flags only: a benchmark may ask for more tokens than an editor setting allows.
        from codespec_lsp.config import MODEL_KEYS, from_cli, normalize
        _, errors, _ = normalize({k: v for k, v in from_cli(args).items() if k in MODEL_KEYS})
        if errors:
            for err in errors:
                print(f"codespec-lsp {args.command}: invalid setting {err}", file=sys.stderr)
            return 2
    if args.command in (None, "serve"):
        from codespec_lsp.lsp.server import run_server
        return run_server(args)
    if args.command == "complete":
        from codespec_lsp.completion.complete import run_complete
        try:
            status = run_complete(args)
            sys.stdout.flush()  # a pipe is block-buffered: the write happens here, not at exit
            return status
        except BrokenPipeError:
            # `codespec-lsp complete ... | head`: the reader left; say nothing more. Python's
            # advice: point stdout at devnull so the flush at exit does not raise again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
    if args.command == "fetch":
        from codespec_lsp.engine.fetch import run_fetch
        return run_fetch(args)
    if args.command == "bench" and args.bench_command == "engine":
        from codespec_lsp.bench.engine import run_engine_bench
        return run_engine_bench(args)
    if args.command == "bench" and args.bench_command == "server":
        from codespec_lsp.bench.server import run_server_bench
        return run_server_bench(args)
    if args.command == "bench" and args.bench_command == "quality":
        from codespec_lsp.bench.quality import run_quality_bench
        return run_quality_bench(args)
    if args.command == "bench" and args.bench_command == "context":
        from codespec_lsp.bench.context import run_context_bench
        return run_context_bench(args)
    if args.command == "doctor":
        from codespec_lsp.planning.doctor import run_doctor
        return run_doctor(args)
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
