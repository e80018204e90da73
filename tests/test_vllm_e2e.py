"""End to end against a real vLLM serving the embedded pair with draft-model speculation.

Opt-in: vLLM lives in its own venv (`CODESPEC_VLLM=1 scripts/setup.sh` or
`scripts/serve_vllm.sh --install-only`), found through CODESPEC_VLLM_VENV (default .venv-vllm).
Without it every test here is skipped. CODESPEC_VLLM_URL points at a server already running
(then none is started). vLLM takes 60-90 s to start on 2 cores: one server for the session.
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import time

import httpx
import pytest

from codespec_lsp import TINY_DIR
from codespec_lsp.engine.api import CancelToken
from codespec_lsp.remote import connect_remote
from codespec_lsp.remote.metrics import parse

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

ROOT = pathlib.Path(__file__).resolve().parent.parent
TINY = TINY_DIR
VENV = pathlib.Path(os.environ.get("CODESPEC_VLLM_VENV", ROOT / ".venv-vllm"))
START_LIMIT_S = 300

# Held-out points: code the pair was not trained on, cut mid-function.
POINTS = [
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return ",
    "import os\n\n\ndef list_python_files(folder):\n    result = []\n    for name in os.listdir(folder):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n        ",
    "def read_lines(path):\n    with open(path) as f:\n        return ",
]


def _vllm_installed() -> bool:
    return any((VENV / "lib").glob("python3*/site-packages/vllm/__init__.py"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(tmp_path_factory, **env_extra):
    """A vLLM server (scripts/serve_vllm.sh) for the session: yields its URL, stops it after."""
    if not _vllm_installed():
        pytest.skip(f"vLLM not installed in {VENV} (opt-in: CODESPEC_VLLM=1 scripts/setup.sh)")
    port = _free_port()
    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    env = {**os.environ, "CODESPEC_VLLM_VENV": str(VENV), "PORT": str(port), **env_extra}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(["bash", str(ROOT / "scripts" / "serve_vllm.sh")], env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + START_LIMIT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            pytest.fail(f"vLLM did not start in {START_LIMIT_S} s:\n{log_path.read_text()[-3000:]}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def vllm_url(tmp_path_factory):
    if url := os.environ.get("CODESPEC_VLLM_URL"):
        yield url
        return
    yield from _serve(tmp_path_factory)


@pytest.fixture(scope="session")
def remote(vllm_url):
    backend = connect_remote(vllm_url, tokenizer=str(TINY / "target"))
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def local():
    from codespec_lsp.engine import load_engine
    return load_engine(preset="tiny", device="cpu")


def server_counters(url: str) -> dict[str, float]:
    return parse(httpx.get(url.removesuffix("/v1") + "/metrics", timeout=5).text)


def local_greedy(engine, text: str, n: int) -> tuple[list[int], list[int]]:
    """(prompt ids with BOS, the in-process engine's greedy ids) through whichever API it has."""
    if hasattr(engine, "encode"):  # the seam: ids in, a Generation of ids out
        ids = engine.encode(text)
        gen = engine.generate(ids, max_new_tokens=n)
        out = list(gen)
        gen.close()
        return ids, out
    ids = engine.encode_prompt(text, reserve=n + 9)
    return ids, engine.generate(text, max_new_tokens=n).tokens


def test_remote_greedy_equals_local_greedy_for_the_same_ids(remote, local):
    assert remote.kind == "vllm"
    for text in POINTS:
        ids, expected = local_greedy(local, text, 24)
        assert remote.encode(text) == ids and ids[0] == local.tokenizer.bos_token_id
        gen = remote.generate(ids, max_new_tokens=24, key="file:///e2e.py")
        assert list(gen) == expected, text
        assert gen.result.stop_reason in ("max_tokens", "eos")


def test_the_servers_tokenize_gives_the_same_ids(vllm_url, local):
    bare = connect_remote(vllm_url, tokenizer=None)
    try:
        bare.tokenizer = None  # the model folder is on this machine: force the server's /tokenize
        for text in POINTS[:2]:
            assert bare.encode(text) == local_greedy(local, text, 1)[0]
    finally:
        bare.close()


def test_server_metrics_report_speculation_and_prefix_cache(remote):
    ids = remote.encode("".join(POINTS) * 3)  # several of vLLM's KV blocks (128 tokens on CPU)
    for _ in range(2):  # the second run finds the prompt in vLLM's prefix cache
        list(remote.generate(ids, max_new_tokens=16))
    stats = remote.refresh_metrics()
    assert stats["backend"] == "vllm"
    assert stats["server_acceptance_rate"] is not None and 0 < stats["server_acceptance_rate"] <= 1
    assert stats["server_prefix_cache_hit_rate"] is not None and stats["server_prefix_cache_hit_rate"] > 0


def test_a_model_vllm_does_not_serve_is_told_once(vllm_url):
    notices = []
    bad = connect_remote(vllm_url, model="codellama-13b", notify=lambda *n: notices.append(n),
                         backoff_s=(0.0, 0.0))
    try:
        for _ in range(2):
            assert list(bad.generate([1, 2, 3], max_new_tokens=4)) == []
        assert len(notices) == 1 and "codellama-13b" in notices[0][1] and "tiny" in notices[0][1]
    finally:
        bad.close()


# ---------------------------------------------------------------- through complete.py and the LSP


def suggestion(backend, key: str, text: str, max_tokens: int = 24, copy_weight: float | None = None
               ) -> str | None:
    """What complete_at shows. The copy prior only exists in process (vLLM's API gives no per-step
    scores to reweigh), so a local suggestion to compare with a remote one is made without it."""
    from codespec_lsp.completion.complete import complete_at
    from codespec_lsp.config import default_context_tokens
    from codespec_lsp.completion.context import ContextBuilder
    builder = ContextBuilder(backend.count_tokens,
                             default_context_tokens(backend.context_window, max_tokens),
                             fim_tokens=backend.fim_tokens)
    return complete_at(backend, builder, key, text, len(text), max_tokens=max_tokens,
                       copy_weight=copy_weight)[1]


def test_remote_suggestion_equals_local_suggestion_at_several_points(remote, local):
    for i, text in enumerate(POINTS):
        assert suggestion(remote, f"file:///s{i}.py", text) == \
            suggestion(local, f"file:///s{i}.py", text, copy_weight=0.0), text


async def test_inline_completions_over_stdio_equal_local(vllm_url, local):
    import asyncio

    from lsprotocol import types

    from lsp_helpers import open_doc, stats
    from tests.test_remote_lsp import inline, start, stop

    # No time budget: on a busy machine the words written by then would show, not the whole line.
    client = await start("--remote", vllm_url, "--target", str(TINY / "target"),
                         options={"maxTokens": 24, "timeBudgetMs": 0})
    try:
        st = await stats(client)
        assert st["backend"] == "vllm"
        for i, text in enumerate(POINTS):
            lines = text.split("\n")
            uri = open_doc(client, f"vllm_{i}.py", text)
            await asyncio.sleep(1.1)  # a pause, not typing: the full suggestion length
            # The same file name: it heads the prompt (context._header)
            assert await inline(client, uri, len(lines) - 1, len(lines[-1])) == \
                suggestion(local, uri, text, copy_weight=0.0), text

        st = await stats(client)
        assert st["server_acceptance_rate"] is not None
    finally:
        await stop(client)


# ------------------------------------------------------------ smol (SmolLM2-135M), exact mode

def _smol_folder() -> pathlib.Path:
    from codespec_lsp.engine import fetch
    folder = fetch.preset_dir("smol")
    if not fetch.is_converted(folder):
        pytest.skip("smol is not fetched (codespec-lsp fetch smol)")
    return folder


@pytest.fixture(scope="session")
def smol_url(tmp_path_factory):
    if url := os.environ.get("CODESPEC_VLLM_SMOL_URL"):
        yield url
        return
    yield from _serve(tmp_path_factory, TARGET=str(_smol_folder()), DRAFT="none",
                      MAX_MODEL_LEN="4096")


def unseen_line_starts(n: int = 8) -> list[str]:
    """The text before `n` line starts (after indentation) of benchmarks/unseen_check: code
    written after SmolLM2 was trained."""
    from codespec_lsp.bench.quality import quality_points
    files = sorted((ROOT / "benchmarks" / "unseen_check").rglob("*.py"))
    points = [p for p in quality_points(files, 4 * n, seed=1) if p.kind == "line_start"][:n]
    return [p.source[:p.offset] for p in points]


def test_smol_served_by_vllm_equals_the_in_process_smol_in_exact_mode(smol_url):
    from codespec_lsp.completion.complete import complete_at
    from codespec_lsp.completion.context import ContextBuilder
    from codespec_lsp.config import default_context_tokens
    from codespec_lsp.engine import load_engine
    folder = _smol_folder()
    local = load_engine(preset="smol", device="cpu", exact=True)
    remote = connect_remote(smol_url, tokenizer=str(folder))
    try:
        assert remote.stop_ids == local.stop_ids  # every end id, sent as stop_token_ids
        same = 0
        for i, text in enumerate(unseen_line_starts()):
            shown = []
            for backend in (local, remote):
                builder = ContextBuilder(backend.count_tokens,
                                         default_context_tokens(backend.context_window, 24),
                                         fim_tokens=backend.fim_tokens)
                shown.append(complete_at(backend, builder, f"file:///u{i}.py", text, len(text),
                                         max_tokens=24, exact=True)[1])
            same += shown[0] == shown[1]
        assert same >= 7  # fp32 on both sides; a near-tie in the logits may still flip one
    finally:
        remote.close()


def test_closing_the_stream_stops_the_servers_generation(smol_url):
    """Cancel after 5 tokens: the stream closes and vLLM stops the request. Run on smol: the
    6 M tiny target writes 1,500 tokens faster than an abort crosses the process boundary, which
    made this check a race of timings rather than of behaviour."""
    remote = connect_remote(smol_url, tokenizer=str(_smol_folder()))
    try:
        before = server_counters(smol_url).get("vllm:generation_tokens", 0.0)
        cancel = CancelToken()
        ids = remote.encode("numbers = [\n    1,\n    2,\n    3,\n")  # a list that goes on
        gen = remote.generate(ids, max_new_tokens=1500, cancel=cancel, key="file:///long.py")
        got = [next(gen) for _ in range(5)]
        cancel.cancel()
        assert list(gen) == [] and gen.result.cancelled and len(got) == 5
        end = time.monotonic() + 30
        while time.monotonic() < end:
            counters = server_counters(smol_url)
            if counters.get("vllm:num_requests_running", 1) == 0:
                break
            time.sleep(0.2)
        assert counters["vllm:num_requests_running"] == 0
        assert counters["vllm:generation_tokens"] - before < 200  # far below the 1,500 asked
        assert remote.in_flight() == 0
    finally:
        remote.close()


def test_superseded_requests_close_their_streams(smol_url):
    """Twenty keystrokes, each superseding the last generation of one document: as the scheduler
    does (lsp/supersede.py), the next keystroke sets the stale request's cancel token and the
    worker still iterating it stops, which closes its stream. On smol for the reason above: the
    tiny target wrote about 100 tokens in the time an abort took on a busy machine."""
    remote = connect_remote(smol_url, tokenizer=str(_smol_folder()))
    try:
        before = server_counters(smol_url).get("vllm:generation_tokens", 0.0)
        text = "numbers = [\n    1,\n    2,\n    3,\n"  # a list that goes on
        gen = stale = None
        for i in range(20):
            if gen is not None:
                stale.cancel()
                assert list(gen) == []  # the worker sees the token at once and stops
            stale = CancelToken()
            gen = remote.generate(remote.encode(text + f"    {i}"), max_new_tokens=1000,
                                  key="file:///typing.py", cancel=stale)
            next(gen)  # the stream is running when the next keystroke supersedes it
        gen.close()
        end = time.monotonic() + 30
        while time.monotonic() < end and server_counters(smol_url)["vllm:num_requests_running"] > 0:
            time.sleep(0.2)
        counters = server_counters(smol_url)
        assert counters["vllm:num_requests_running"] == 0
        assert counters["vllm:generation_tokens"] - before < 20 * 1000 / 10  # 20 read here; 5,070 unclosed
        assert remote.in_flight() == 0
    finally:
        remote.close()


async def test_typing_over_stdio_closes_superseded_streams(smol_url):
    """Twenty keystrokes through the language server, each request superseding the last: their
    streams close, so vLLM writes a few tokens for each, not the suggestion's 24. On smol, which
    writes slower than an abort crosses to vLLM (see above)."""
    import asyncio

    from lsprotocol import types

    from lsp_helpers import open_doc
    from tests.test_remote_lsp import inline, start, stop

    client = await start("--remote", smol_url, "--target", str(_smol_folder()),
                         options={"maxTokens": 24})
    try:
        text = "numbers = [\n    1,\n    2,\n    3,\n    "  # a list that goes on
        uri = open_doc(client, "vllm_typing.py", text)
        line, col = text.count("\n"), len(text.split("\n")[-1])
        before = server_counters(smol_url)["vllm:generation_tokens"]
        pending = []
        for k in range(20):
            client.text_document_did_change(types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=k + 2),
                content_changes=[types.TextDocumentContentChangePartial(
                    range=types.Range(types.Position(line, col + k), types.Position(line, col + k)),
                    text="x")]))
            pending.append(asyncio.ensure_future(inline(client, uri, line, col + k + 1)))
            await asyncio.sleep(0.03)
        await asyncio.gather(*pending, return_exceptions=True)
        end = time.monotonic() + 30
        while time.monotonic() < end and server_counters(smol_url)["vllm:num_requests_running"]:
            await asyncio.sleep(0.2)
        after = server_counters(smol_url)
        assert after["vllm:num_requests_running"] == 0
        assert after["vllm:generation_tokens"] - before < 20 * 24 / 4  # 25 read here; 293 unsuperseded
    finally:
        await stop(client)
