"""The remote backend against an in-process fake OpenAI-compatible server: streaming, token ids,
server dialects, cancel closing the stream, every bad condition with one notice, recovery."""

from __future__ import annotations

import logging
import subprocess
import time

import pytest

from codespec_lsp.completion.heal import healing
from codespec_lsp.engine.api import CancelToken, ModelLoadError
from codespec_lsp.remote import ServerClient, connect_remote
from codespec_lsp.remote.client import CONNECT_TIMEOUT_S, normalize_url
from tests.fake_openai_server import BOS, EOS, FakeServer, FakeState, fake_tokenize, next_tokens


class CharTokenizer:
    """Stands in for the HF tokenizer: one id per character, like the fake server's /tokenize."""
    bos_token_id, eos_token_id, model_max_length = BOS, EOS, 2048

    def encode(self, text: str, add_special_tokens: bool = False, verbose: bool = True) -> list[int]:
        return ([BOS] if add_special_tokens else []) + fake_tokenize(text)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr((i - 3) % 3000) for i in ids if i > 2)

    def batch_decode(self, seqs, skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(ids) for ids in seqs]

    def get_vocab(self) -> dict:
        return {}

    def __len__(self) -> int:
        return 3003


class Notices(list):
    def __call__(self, level: str, message: str) -> None:
        self.append((level, message))


def until(predicate, timeout: float = 5.0) -> bool:
    """Poll a condition the server thread sets (a bound, not a timing assertion)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


@pytest.fixture
def fake():
    with FakeServer() as server:
        yield server


def backend_for(server, notices=None, **kw):
    kw.setdefault("backoff_s", (0.0, 0.0))  # retry at once: these tests need no waiting
    return connect_remote(server.url if hasattr(server, "url") else server, tokenizer=CharTokenizer(),
                          notify=notices if notices is not None else Notices(), **kw)


# ---------------------------------------------------------------- streaming and dialects


def test_vllm_stream_yields_the_server_ids_for_the_prompt_ids_with_bos(fake):
    b = backend_for(fake)
    ids = b.encode("def f(x):")
    assert ids[0] == BOS and ids[1:] == fake_tokenize("def f(x):")
    gen = b.generate(ids, max_new_tokens=5, key="file:///a.py")
    assert list(gen) == next_tokens(ids, 5)
    r = gen.result
    assert r.tokens == next_tokens(ids, 5) and r.stop_reason == "max_tokens" and not r.cancelled
    assert r.logprobs == [-0.5] * 5 and r.target_forwards == 5
    body = fake.completions()[0]["body"]
    assert body["prompt"] == ids and body["stream"] is True and body["model"] == "fake-model"
    assert body["return_token_ids"] is True and "cache_prompt" not in body
    assert b.kind == "vllm" and b.context_window == 2048 and b.in_flight() == 0
    b.close()


def test_eos_ends_the_generation_and_is_not_yielded(fake):
    fake.state.eos_after = 3
    b = backend_for(fake)
    gen = b.generate([BOS, 5, 6], max_new_tokens=10)
    assert list(gen) == next_tokens([BOS, 5, 6], 3)
    assert gen.result.stop_reason == "eos"
    b.close()


def test_llama_server_gets_cache_prompt_and_its_ids_come_from_logprobs():
    with FakeServer(FakeState(kind="llama-server")) as fake:
        b = backend_for(fake)
        gen = b.generate([BOS, 9, 9], max_new_tokens=4)
        assert list(gen) == next_tokens([BOS, 9, 9], 4)
        body = fake.completions()[0]["body"]
        assert b.kind == "llama-server" and body["cache_prompt"] is True
        assert "return_token_ids" not in body
        assert gen.result.logprobs == [-0.25] * 4
        b.close()


# ---------------------------------------------------------------- token healing

SPACE, Q = fake_tokenize(" ")[0], fake_tokenize("q")[0]


def test_healing_is_offered_only_by_vllm_with_a_local_tokenizer(fake):
    with FakeServer(FakeState(kind="llama-server")) as other:
        assert backend_for(fake).supports_heal and not backend_for(other).supports_heal
    assert not connect_remote(fake.url, notify=Notices()).supports_heal


def test_healing_asks_for_an_allowed_token_then_streams_from_the_healed_prompt(fake):
    b = backend_for(fake)
    ids = b.encode("x =")
    gen = b.generate(ids, max_new_tokens=5, constraint=healing(b, " "))
    healed = ids + [SPACE]
    assert list(gen) == [SPACE] + next_tokens(healed, 4)  # the re-typed space is the first token
    first, main = fake.completions()
    assert first["body"]["allowed_token_ids"] == [SPACE]  # one char re-types " ": only " " may come
    assert first["body"]["max_tokens"] == 1 and first["body"]["stream"] is False
    assert main["body"]["prompt"] == healed and main["body"]["max_tokens"] == 4
    assert "allowed_token_ids" not in main["body"] and gen.result.stop_reason == "max_tokens"
    b.close()


@pytest.mark.parametrize("free_pick, top, expected", [
    (Q, {SPACE: -1.5, fake_tokenize("z")[0]: -0.1}, (SPACE, -1.5)),  # the best allowed alternative
    (SPACE, {}, (SPACE, -0.5)),                                      # the server's own pick
])
def test_a_large_allowed_set_goes_by_the_top_logprobs(fake, monkeypatch, free_pick, top, expected):
    monkeypatch.setattr("codespec_lsp.remote.backend.MAX_ALLOWED_IDS", 0)
    fake.state.script, fake.state.top = [free_pick], top
    b = backend_for(fake)
    gen = b.generate(b.encode("x ="), max_new_tokens=3, constraint=healing(b, " "))
    assert list(gen)[0] == expected[0] and gen.result.logprobs[0] == expected[1]
    first = fake.completions()[0]["body"]
    assert "allowed_token_ids" not in first and first["logprobs"] == 20
    b.close()


def test_when_nothing_retypes_the_healed_text_there_is_no_answer_and_no_stream(fake, monkeypatch):
    monkeypatch.setattr("codespec_lsp.remote.backend.MAX_ALLOWED_IDS", 0)
    fake.state.script = [Q]
    b = backend_for(fake)
    gen = b.generate(b.encode("x ="), max_new_tokens=3, constraint=healing(b, " "))
    assert list(gen) == [] and gen.result.stop_reason == "stop"
    assert [r["body"]["stream"] for r in fake.completions()] == [False]
    b.close()


def test_a_text_only_server_is_retokenized_locally_and_warned_about(caplog):
    with FakeServer(FakeState(kind="openai")) as fake:
        b = backend_for(fake)
        with caplog.at_level(logging.WARNING):
            gen = b.generate([BOS, 4], max_new_tokens=3)
            got = list(gen)
        expected_text = "".join(f"t{t} " for t in next_tokens([BOS, 4], 3))
        assert b.tokenizer.decode(got) == expected_text
        body = fake.completions()[0]["body"]
        assert b.kind == "openai" and "cache_prompt" not in body and "return_token_ids" not in body
        assert caplog.text.count("may differ") == 1
        b.close()


def test_server_tokenize_is_used_without_a_local_tokenizer(fake):
    b = connect_remote(fake.url, notify=Notices())
    assert b.local_tokenizer is None  # the fake's model is not a folder here
    assert b.encode("ab") == [BOS] + fake_tokenize("ab")
    assert any(r["path"] == "/tokenize" for r in fake.state.requests)
    assert b.count_tokens("abcdef") >= 2
    b.close()


def test_prompts_longer_than_the_window_keep_bos_and_the_tail():
    with FakeServer(FakeState(max_model_len=64)) as fake:
        b = backend_for(fake)
        ids = [BOS] + list(range(10, 110))
        list(b.generate(ids, max_new_tokens=8))
        sent = fake.completions()[0]["body"]["prompt"]
        assert len(sent) == 56 and sent[0] == BOS and sent[-1] == 109
        b.close()


def test_prefill_asks_for_one_token_and_reports_no_new_tokens(fake):
    b = backend_for(fake)
    r = b.prefill([BOS, 7, 8, 9], key="k")
    assert fake.completions()[0]["body"]["max_tokens"] == 1
    assert r.tokens == [] and r.prefill_tokens == 4 and not r.cancelled
    b.close()


# ---------------------------------------------------------------- cancel closes the stream


def slow_fake():
    return FakeServer(FakeState(token_delay_s=0.02))


@pytest.mark.parametrize("how", ["token", "close"])
def test_cancel_closes_the_stream_and_the_server_stops(how):
    with slow_fake() as fake:
        b = backend_for(fake)
        cancel = CancelToken()
        gen = b.generate([BOS, 3], max_new_tokens=500, cancel=cancel, key="k")
        got = [next(gen) for _ in range(3)]
        if how == "token":
            cancel.cancel()
            assert list(gen) == []
            assert gen.result.cancelled and gen.result.stop_reason == "cancelled"
        else:  # the caller stopping (e.g. at the block end) is not a cancel
            gen.close()
            assert not gen.result.cancelled and gen.result.stop_reason == "stop"
            assert list(gen) == []
        assert gen.result.tokens == got
        assert until(lambda: fake.state.aborted == 1)
        assert fake.state.sent[0] < 100 and fake.state.running == 0
        assert b.in_flight() == 0
        b.close()


def test_a_stale_requests_cancel_token_closes_its_stream():
    """The backend has no supersede of its own (lsp/supersede.py owns "this request is stale"):
    the token the scheduler sets closes the stream, and a second request for the same document
    does not touch the first unless its token says so."""
    with slow_fake() as fake:
        b = backend_for(fake)
        stale = CancelToken()
        first = b.generate([BOS, 3], max_new_tokens=500, key="file:///a.py", cancel=stale)
        next(first)
        other = b.generate([BOS, 4], max_new_tokens=2, key="file:///b.py")
        second = b.generate([BOS, 3, 4], max_new_tokens=3, key="file:///a.py")
        assert b.in_flight() == 3
        stale.cancel()
        assert list(first) == [] and first.result.cancelled
        assert list(second) == next_tokens([BOS, 3, 4], 3)
        assert list(other) == next_tokens([BOS, 4], 2)
        assert until(lambda: fake.state.aborted == 1) and fake.state.finished == 2
        assert until(lambda: b.in_flight() == 0)
        b.close()


# ---------------------------------------------------------------- bad conditions, once each


def test_refused_then_recovery_by_itself():
    fake = FakeServer()
    url, port = fake.url, fake.port
    fake.stop()
    notices = Notices()
    b = backend_for(url, notices)
    for _ in range(3):  # keystrokes while the server is down: empty answers, one notice
        gen = b.generate([BOS, 5], max_new_tokens=4, key="k")
        assert list(gen) == [] and gen.result.stop_reason == "error"
    assert [level for level, _ in notices] == ["error"]
    assert "refused" in notices[0][1] and url in notices[0][1]
    fake = FakeServer(port=port)
    try:
        assert list(b.generate([BOS, 5], max_new_tokens=4)) == next_tokens([BOS, 5], 4)
        assert [level for level, _ in notices] == ["error", "info"]
        assert "answers again" in notices[1][1]
    finally:
        fake.stop()
        b.close()


def test_backing_off_answers_empty_without_a_network_call(fake):
    notices = Notices()
    fake.state.mode, fake.state.status = "status", 503
    b = backend_for(fake, notices, backoff_s=(60.0, 60.0))
    list(b.generate([BOS], max_new_tokens=2))
    calls = len(fake.completions())
    gen = b.generate([BOS], max_new_tokens=2)
    assert list(gen) == [] and gen.result.stop_reason == "error"
    assert len(fake.completions()) == calls and len(notices) == 1
    b.close()


@pytest.mark.parametrize("status, condition_text", [
    (500, "HTTP 500"), (503, "HTTP 503"), (400, "HTTP 400"), (401, "API key")])
def test_http_errors_are_told_once_with_the_server_message(fake, status, condition_text):
    fake.state.mode, fake.state.status, fake.state.error_message = "status", status, "boom happened"
    notices = Notices()
    b = backend_for(fake, notices)
    for _ in range(3):
        gen = b.generate([BOS, 1], max_new_tokens=2)
        assert list(gen) == [] and gen.result.stop_reason == "error"
    assert len(notices) == 1 and condition_text in notices[0][1]
    if status != 401:
        assert "boom happened" in notices[0][1]
    fake.state.mode = "ok"
    assert len(list(b.generate([BOS, 1], max_new_tokens=2))) == 2
    assert notices[-1][0] == "info"
    b.close()


def test_a_model_the_server_does_not_serve_names_what_it_serves(fake):
    notices = Notices()
    b = backend_for(fake, notices, model="codellama-13b")
    gen = b.generate([BOS], max_new_tokens=2)
    assert list(gen) == []
    assert len(notices) == 1 and "codellama-13b" in notices[0][1] and "fake-model" in notices[0][1]
    b.close()


def test_a_server_without_completions_says_which_url_to_give(fake):
    fake.state.mode = "no_completions"
    notices = Notices()
    b = backend_for(fake, notices)
    assert list(b.generate([BOS], max_new_tokens=2)) == []
    assert len(notices) == 1 and "/v1/completions" in notices[0][1]
    b.close()


def test_a_url_that_is_not_an_openai_base_is_told_at_connect(fake):
    notices = Notices()
    b = backend_for(fake.url[:-3] + "/api", notices)
    assert len(notices) == 1 and "OpenAI-compatible" in notices[0][1]
    b.close()


def test_a_hung_stream_is_cut_by_the_read_timeout(fake):
    fake.state.mode = "hang"
    notices = Notices()
    b = backend_for(fake, notices, read_timeout_s=0.3)
    gen = b.generate([BOS, 2], max_new_tokens=50)
    got = list(gen)
    assert len(got) == 1 and gen.result.stop_reason == "error"
    assert len(notices) == 1 and "sent nothing" in notices[0][1]
    assert until(lambda: fake.state.aborted == 1)
    b.close()


def test_a_stream_past_its_deadline_is_cut(fake):
    fake.state.token_delay_s = 0.05
    notices = Notices()
    b = backend_for(fake, notices, deadline_s=0.3)
    gen = b.generate([BOS, 2], max_new_tokens=200)
    got = list(gen)
    assert 0 < len(got) < 200 and gen.result.stop_reason == "error"
    assert len(notices) == 1 and "ran past" in notices[0][1]
    b.close()


def test_a_stream_that_is_not_json_is_an_error_not_a_crash(fake):
    fake.state.mode = "garbage"
    notices = Notices()
    b = backend_for(fake, notices)
    assert list(b.generate([BOS], max_new_tokens=3)) == []
    assert len(notices) == 1 and "not JSON" in notices[0][1]
    b.close()


# ---------------------------------------------------------------- security and set-up


def test_the_api_key_comes_from_the_named_variable_and_is_never_logged(fake, monkeypatch, caplog):
    secret = "sk-very-secret-123"
    fake.state.api_key = secret
    monkeypatch.setenv("CODESPEC_TEST_KEY", secret)
    notices = Notices()
    with caplog.at_level(logging.DEBUG):
        b = backend_for(fake, notices, api_key_env="CODESPEC_TEST_KEY")
        assert len(list(b.generate([BOS], max_new_tokens=2))) == 2
        fake.state.mode, fake.state.error_message = "status", f"bad key {secret}"  # echoed back
        list(b.generate([BOS], max_new_tokens=2))
    assert fake.completions()[0]["headers"]["Authorization"] == f"Bearer {secret}"
    assert secret not in caplog.text and secret not in repr(b.client)
    assert notices and all(secret not in message for _, message in notices)
    b.close()


def test_without_the_key_the_server_refuses_and_says_so(fake):
    fake.state.api_key = "k"
    notices = Notices()
    b = backend_for(fake, notices)
    assert list(b.generate([BOS], max_new_tokens=2)) == []
    assert len(notices) == 1 and "apiKeyEnv" in notices[0][1]
    b.close()


def test_a_named_but_unset_key_variable_is_a_setup_error(monkeypatch):
    monkeypatch.delenv("CODESPEC_NOPE", raising=False)
    with pytest.raises(ModelLoadError, match="CODESPEC_NOPE"):
        connect_remote("http://127.0.0.1:9/v1", api_key_env="CODESPEC_NOPE", probe=False)


def test_a_key_over_plain_http_to_another_host_is_warned_about(monkeypatch):
    monkeypatch.setenv("CODESPEC_TEST_KEY", "x")
    notices = Notices()
    b = connect_remote("http://gpu-box.invalid:8000/v1", api_key_env="CODESPEC_TEST_KEY",
                       notify=notices, probe=False)
    assert len(notices) == 1 and "unencrypted" in notices[0][1]
    b.close()


def test_urls_are_checked_and_the_connect_timeout_is_at_most_two_seconds():
    assert normalize_url("http://h:8000") == "http://h:8000/v1"
    assert normalize_url("https://h/v1/") == "https://h/v1"
    with pytest.raises(ValueError, match="http"):
        normalize_url("h:8000")
    with pytest.raises(ModelLoadError):
        connect_remote("ftp://h/v1", probe=False)
    client = ServerClient("http://h/v1", connect_timeout_s=30)
    assert CONNECT_TIMEOUT_S <= 2 and client._http.timeout.connect <= 2


def test_https_with_the_teams_own_ca(tmp_path, monkeypatch):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    made = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
         "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
         "-out", str(cert)], capture_output=True)
    if made.returncode != 0:
        pytest.skip("openssl could not make a test certificate")
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    with FakeServer(tls=(str(cert), str(key))) as fake:
        assert fake.url.startswith("https://")
        b = backend_for(fake)
        assert list(b.generate([BOS, 8], max_new_tokens=3)) == next_tokens([BOS, 8], 3)
        b.close()


# ---------------------------------------------------------------- server metrics


VLLM_METRICS = """\
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 300.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 120.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 900.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""


def test_server_rates_come_from_its_metrics(fake):
    fake.state.metrics = VLLM_METRICS
    b = backend_for(fake)
    stats = b.refresh_metrics()
    assert stats["backend"] == "vllm"
    assert stats["server_acceptance_rate"] == 0.4
    assert stats["server_prefix_cache_hit_rate"] == 0.9
    assert stats["server_requests_running"] == 0
    b.close()


def test_a_server_without_metrics_reports_none(fake):
    b = backend_for(fake)
    stats = b.refresh_metrics()
    assert stats["server_acceptance_rate"] is None and stats["server_prefix_cache_hit_rate"] is None
    b.close()


def test_notices_wait_until_the_server_wires_its_message_channel():
    fake = FakeServer()
    url = fake.url
    fake.stop()
    b = connect_remote(url, tokenizer=CharTokenizer(), notify=None, backoff_s=(0.0, 0.0))
    list(b.generate([BOS], max_new_tokens=2))
    notices = Notices()
    b.health.set_notify(notices)
    assert len(notices) == 1 and "refused" in notices[0][1]
    b.close()


def test_without_a_tokenizer_an_outage_during_tokenize_is_an_empty_answer():
    fake = FakeServer()
    b = connect_remote(fake.url, notify=(notices := Notices()), backoff_s=(0.0, 0.0))
    assert b.local_tokenizer is None and b.encode("ab")
    fake.stop()
    assert b.encode("abc") == []
    gen = b.generate([], max_new_tokens=4)
    assert list(gen) == [] and gen.result.stop_reason == "error"
    assert len(notices) == 1 and "refused" in notices[0][1]
    b.close()


def test_a_flapping_server_is_told_once_not_at_every_flip(fake):
    notices = Notices()
    b = backend_for(fake, notices)
    for _ in range(3):
        fake.state.mode, fake.state.status = "status", 502
        assert list(b.generate([BOS], max_new_tokens=2)) == []
        fake.state.mode = "ok"
        assert len(list(b.generate([BOS], max_new_tokens=2))) == 2
    assert [level for level, _ in notices] == ["error", "info"]
    b.close()


def test_finished_streams_are_read_to_the_end_and_keep_the_connection(fake):
    b = backend_for(fake)
    for _ in range(3):
        gen = b.generate([BOS, 6], max_new_tokens=3)
        assert len(list(gen)) == 3 and gen.result.stop_reason == "max_tokens"
    assert fake.state.aborted == 0 and fake.state.finished == 3
    assert gen.result.reused_tokens == 0 and gen.result.prefill_tokens == 2  # from the usage chunk
    b.close()


def test_prefill_counts_follow_the_documents_last_prompt_until_the_server_says(fake):
    fake.state.token_delay_s = 0.02
    b = backend_for(fake)
    first = b.generate([BOS] + list(range(10, 60)), max_new_tokens=100, key="doc")
    next(first)
    assert (first.result.reused_tokens, first.result.prefill_tokens) == (0, 51)
    first.close()  # closed early: no usage chunk, the estimate stays
    second = b.generate([BOS] + list(range(10, 61)), max_new_tokens=100, key="doc")
    next(second)
    assert (second.result.reused_tokens, second.result.prefill_tokens) == (51, 1)
    second.close()
    b.close()


def test_a_connect_that_times_out_once_is_tried_again_not_told(fake, monkeypatch):
    """A busy machine (2 cores, vLLM on CPU) once let a loopback connect run past 2 s: that one
    slow connect put the document into back-off and its keystroke got nothing."""
    import httpcore
    from httpcore._backends.auto import AutoBackend
    real, failed = AutoBackend.connect_tcp, []

    async def slow_once(self, *args, **kwargs):
        if not failed:
            failed.append(True)
            raise httpcore.ConnectTimeout("timed out")
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(AutoBackend, "connect_tcp", slow_once)
    notices = Notices()
    b = backend_for(fake, notices)  # its probe makes the first connection
    gen = b.generate([BOS, 7], max_new_tokens=3)
    assert list(gen) == next_tokens([BOS, 7], 3) and gen.result.stop_reason == "max_tokens"
    assert failed and notices == []
    b.close()
