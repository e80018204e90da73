import asyncio
import logging
import threading

import pytest

from codespec_lsp.config import Settings
from codespec_lsp.lsp.host import EngineHost
from codespec_lsp.completion.rhythm import Rhythm
from codespec_lsp.lsp.cache import CompletionCache, Hit
from codespec_lsp.lsp.scheduler import CompletionRequest, Scheduler, split_line
from codespec_lsp.lsp.supersede import Supersede
from fake_engine import FakeEngine

STATS_FIELDS = {
    "requests", "answered", "cancelled", "superseded", "typing_through_hits",
    "cache_reused_tokens", "prefill_tokens", "acceptance_rate", "tokens_per_target_forward",
    "latency_ms_p50", "latency_ms_p95", "draft", "target", "device", "state", "preset",
    "backend", "server_acceptance_rate", "server_prefix_cache_hit_rate",
}


class FakeClock:
    """Sleeps resolve only when the test advances the clock."""

    def __init__(self):
        self.now = 0.0
        self._sleepers: list[tuple[float, asyncio.Future]] = []

    async def sleep(self, s: float) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._sleepers.append((self.now + s, fut))
        await fut

    def advance(self, s: float) -> None:
        self.now += s
        for t, fut in self._sleepers:
            if t <= self.now and not fut.done():
                fut.set_result(None)


async def settle(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def idle(s: Scheduler) -> None:
    """Until the engine worker has run everything submitted so far (it is one FIFO thread), and
    the event loop has taken the results: no wall-clock windows."""
    await settle(10)
    await asyncio.wrap_future(s._executor.submit(lambda: None))
    await settle(10)


def make(engine=None, clock=None, **settings):
    host = EngineHost(loader=lambda s: engine)
    host.engine, host.state = engine, "ready" if engine else "loading"
    cfg = Settings(debounce_ms=settings.pop("debounce_ms", 0), **settings)
    if clock is None:
        return Scheduler(host, lambda: cfg)
    return Scheduler(host, lambda: cfg, sleep=clock.sleep, clock=lambda: clock.now)


def req(source, offset=None, key="file:///a.py"):
    return CompletionRequest(key, source, len(source) if offset is None else offset)


# ------------------------------------------------------------ rhythm


def _typed(rhythm: Rhythm, gaps):
    t = 0.0
    rhythm.keystroke(t)
    for g in gaps:
        t += g
        rhythm.keystroke(t)


def test_rhythm_keeps_base_until_it_knows_the_rhythm():
    r = Rhythm()
    _typed(r, [0.1])
    assert r.plan(0.06, 48) == (0.06, 48)


def test_fast_typing_with_unknown_model_speed_waits_for_a_pause():
    r = Rhythm()
    _typed(r, [0.1] * 5)
    delay, tokens = r.plan(0.06, 48)
    assert delay == pytest.approx(0.15) and tokens == 48


def test_fast_typing_with_slow_model_waits_for_a_pause():
    r = Rhythm()
    _typed(r, [0.1] * 5)
    r.generated(wall_s=0.44, tokens=21)  # 20 ms a token: nothing useful fits in 20 ms
    delay, tokens = r.plan(0.06, 48)
    assert delay == pytest.approx(0.15) and tokens == 48


def test_fast_typing_does_not_stretch_the_debounce_at_a_line_start():
    r = Rhythm()
    _typed(r, [0.1] * 5)
    r.generated(wall_s=0.44, tokens=21)
    assert r.plan(0.06, 48, line_start=True) == (0.06, 48)
    assert r.plan(0.06, 48)[0] == pytest.approx(0.15)  # mid-line it still waits for a pause


def test_generation_is_cut_to_fit_the_gap():
    r = Rhythm()
    _typed(r, [0.3] * 5)
    for n in (4, 8, 12, 16):
        r.generated(wall_s=0.03 + 0.01 * n, tokens=n)  # 30 ms fixed, 10 ms a token
    fixed, per = r.cost()
    assert fixed == pytest.approx(0.03) and per == pytest.approx(0.01)
    delay, tokens = r.plan(0.06, 48)
    # (0.3 * 0.7 - 0.06 - 0.03) / 0.01 = 12 tokens finish before the next keystroke
    assert delay == 0.06 and tokens == 12


def test_fixed_cost_alone_can_rule_out_a_call():
    r = Rhythm()
    _typed(r, [0.3] * 5)
    for n in (1, 2, 3, 6):
        r.generated(wall_s=0.16 + 0.001 * n, tokens=n)  # slow start, then fast
    delay, tokens = r.plan(0.06, 48)
    assert delay == pytest.approx(0.45) and tokens == 48  # waits past the gap, for a pause


def test_outliers_do_not_drag_the_cost_model():
    r = Rhythm()
    for n in (2, 4, 6, 8, 10, 12):
        r.generated(wall_s=0.02 + 0.01 * n, tokens=n)
    r.generated(wall_s=0.9, tokens=1)  # the machine was busy for a moment
    fixed, per = r.cost()
    assert fixed == pytest.approx(0.02, abs=0.01) and per == pytest.approx(0.01, abs=0.003)


def test_cold_prefill_samples_are_ignored():
    r = Rhythm()
    r.generated(wall_s=3.0, tokens=5, prefill_tokens=1500)
    assert r.cost() is None


def test_fast_model_keeps_full_length():
    r = Rhythm()
    _typed(r, [0.3] * 5)
    r.generated(wall_s=0.05, tokens=49)  # 1 ms a token
    assert r.plan(0.06, 48) == (0.06, 48)


def test_cancelled_generations_teach_speed_too_and_empty_ones_nothing():
    r = Rhythm()
    r.generated(wall_s=1.0, tokens=0)
    assert r.cost() is None
    r.generated(wall_s=0.1, tokens=9)
    assert r.cost() == pytest.approx((0.01, 0.01))


def test_slow_typing_stretch_is_capped_and_pauses_ignored():
    r = Rhythm()
    _typed(r, [0.1, 5.0, 0.1, 30.0, 0.1])
    assert len(r._gaps) == 3
    r.generated(wall_s=1.0, tokens=9)
    delay, _ = r.plan(0.1, 48)
    assert delay == pytest.approx(0.15)
    r2 = Rhythm()
    _typed(r2, [0.5] * 4)
    r2.generated(wall_s=10.0, tokens=9)
    assert r2.plan(0.06, 48)[0] == pytest.approx(Rhythm.MAX_DEBOUNCE_S)


class SlowFake(FakeEngine):
    """Reports generations slower than the typing gap (without really taking that long)."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.reported_s_per_token = 0.05


async def test_steady_fast_typing_spends_no_forwards_between_keystrokes():
    clock = FakeClock()
    eng = SlowFake()
    warm_tokens, prefill = [], eng.prefill

    def counted(ids, **kw):
        result = prefill(ids, **kw)
        warm_tokens.append(result.prefill_tokens)
        return result
    eng.prefill = counted
    s = make(eng, clock, debounce_ms=60)
    tasks, text = [], "x = "
    for ch in "abcdefghijkl":
        text += ch
        tasks.append(asyncio.ensure_future(s.complete(req(text))))
        await settle()
        clock.advance(0.1)
        await idle(s)
    clock.advance(1.0)
    outs = await asyncio.gather(*tasks)
    # Two gaps make a rhythm: the first two keystrokes are answered with the base debounce.
    # Then the model is known to be slower than the typing: the debounce is stretched past the
    # gap and every keystroke is overtaken before a generation starts, until the pause.
    assert [o.status for o in outs] == ["answered"] * 2 + ["superseded"] * 9 + ["answered"]
    assert eng.calls == 3
    # ...while the prompt cache is kept level with the typing, keystroke by keystroke.
    assert len(eng.prefills) == 10
    assert eng.prefills[-1] == "# a.py\nx = abcdefghijkl" == eng.prompts[-1]  # headed by its path
    assert s.stats.wasted_target_forwards == 0
    # the stats count that prompt work too: on a loaded machine it can be all of it
    assert s.stats.prefill_tokens >= sum(warm_tokens) > 0


async def test_moderate_typing_gets_suggestions_cut_to_fit_the_gap():
    class TenMsPerToken(FakeEngine):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.reported_s_per_token = 0.01

    clock = FakeClock()
    eng = TenMsPerToken()
    s = make(eng, clock, debounce_ms=60, max_tokens=48)
    text = "x = "
    for ch in "abcdef":
        text += ch
        task = asyncio.ensure_future(s.complete(req(text)))
        await settle()
        clock.advance(0.06)
        assert (await asyncio.wait_for(task, 5)).status == "answered"
        clock.advance(0.24)
    # Once the 300 ms rhythm is known, with 10 ms fixed + 10 ms a token:
    # (0.3 * 0.7 - 0.06 - 0.01) / 0.01 = 14 tokens at most.
    assert eng.max_tokens_seen[:2] == [48, 48]  # two gaps make a rhythm
    assert eng.max_tokens_seen[-1] == 14


# ------------------------------------------------------------ cache


def test_cache_repeat_and_typing_through():
    c = CompletionCache()
    src = "x = \nprint(x)\n"
    c.put("u", src, 4, "value + 1")
    assert c.get("u", src, 4) == Hit("value + 1", "repeat")
    typed = "x = val\nprint(x)\n"
    assert c.get("u", typed, 7) == Hit("ue + 1", "typing_through")
    assert c.get("u", "x = vax\nprint(x)\n", 7) is None      # typed something else
    assert c.get("u", "y = val\nprint(x)\n", 7) is None      # text above changed
    assert c.get("u", "x = val\nprint(y)\n", 7) is None      # text below changed
    assert c.get("u", "x = value + 1\nprint(x)\n", 13) is None  # typed it all: nothing left


def test_typing_through_an_opener_the_editor_closed():
    c = CompletionCache()
    below = "\nprint(y)\n"
    c.put("u", "y = " + below, 4, 'open("data.txt")')
    # the user types `open(`; the editor adds `)` right of the cursor
    assert c.get("u", "y = open()" + below, 9) == Hit('"data.txt"', "typing_through")
    # then `"`, auto-closed too: the rest stops before both closers
    shown = c.get("u", 'y = open("")' + below, 10)
    assert shown == Hit("data.txt", "typing_through")
    # accepting what is shown leaves exactly the suggested line
    assert 'y = open("' + shown[0] + '")' == 'y = open("data.txt")'
    # typed to the closers: nothing is left to show
    assert c.get("u", 'y = open("data.txt")' + below, 19) is None


def test_typing_through_closers_the_rest_goes_on_past():
    """Issue 28: a rest that goes on past the closer the editor inserted (`f(` → `f()`) was
    dropped and the model asked again. It now replaces the closer, so accepting it leaves exactly
    the suggested text; editors draw it around the closer."""
    c = CompletionCache()
    c.put("u", "y = \n", 4, "f(a) or b")
    hit = c.get("u", "y = f()\n", 6)
    assert hit == Hit("a) or b", "typing_through", replace=1)
    assert "y = f(" + hit.text + "y = f()\n"[6 + hit.replace:] == "y = f(a) or b\n"
    c.put("u", "z = \n", 4, "g(a)\nh(b)")
    hit = c.get("u", "z = g()\n", 6)           # the rest runs on to another line
    assert hit == Hit("a)\nh(b)", "typing_through", replace=1)
    c.put("u", "s = \n", 4, 'open("a.txt").read()')
    hit = c.get("u", 's = open("")\n', 10)      # two closers, both typed over
    assert hit == Hit('a.txt").read()', "typing_through", replace=2)
    assert 's = open("' + hit.text + 's = open("")\n'[10 + hit.replace:] == \
        's = open("a.txt").read()\n'


def test_typing_through_closers_refuses_what_accepting_would_break():
    c = CompletionCache()
    c.put("u", "w = \n", 4, "k()")
    assert c.get("u", "w = k()\n", 6) is None       # nothing left but the closer itself
    c.put("u", "v = \n", 4, "m(a)")
    assert c.get("u", "v = m(]\n", 6) is None       # not the closer the suggestion writes
    c.put("u", "t = \n", 4, "n(a\n)")
    assert c.get("u", "t = n()\n", 6) is None       # its closer is on another line: not drawable


def test_cache_is_bounded():
    c = CompletionCache(maxsize=4)
    for i in range(50):
        c.put("u", f"line{i}", 5, "x")
    assert len(c._lru) == 4


def test_cache_forget():
    c = CompletionCache()
    c.put("u", "abc", 3, "d")
    c.forget("u")
    assert c.get("u", "abc", 3) is None


def test_split_line():
    src = "def f():\n\n    x = 1\n    y"
    assert split_line(src, len(src)) == ("    y", "", "    x = 1")
    assert split_line("a(b)", 2) == ("a(", "b)", "")


# ------------------------------------------------------------ scheduler


async def test_answer_is_postprocessed_and_counted():
    eng = FakeEngine()
    s = make(eng)
    out = await s.complete(req("x = "))
    assert out.status == "answered" and out.text == "value + 1" and out.id
    st = s.stats.report(s.host)
    assert set(st) == STATS_FIELDS
    assert st["requests"] == 1 and st["answered"] == 1 and st["state"] == "ready"
    assert st["target"] == "fake-target" and st["preset"] == "fake" and st["prefill_tokens"] > 0
    assert 0 < st["tokens_per_target_forward"]


async def test_block_mode_stops_at_dedent_inside_engine():
    eng = FakeEngine()
    s = make(eng)
    out = await s.complete(req("def f(value):"))
    assert out.text == "\n    return value + 1"
    # stop_fn ended generation before the script's "def other()" was produced
    assert out.result.stop_reason == "stop"


async def test_repeat_and_typing_through_cost_no_model_call():
    eng = FakeEngine()
    s = make(eng)
    await s.complete(req("x = "))
    again = await s.complete(req("x = "))
    typed = await s.complete(req("x = valu"))
    assert again.text == "value + 1" and again.status == "repeat"
    assert typed.text == "e + 1" and typed.status == "typing_through"
    # A repeat is not typing through (issue 13): each has its own counter, both are answers.
    assert eng.calls == 1 and s.stats.typing_through_hits == 1 and s.stats.repeats == 1
    assert s.stats.answered == 3 and s.stats.counters(s.host)["repeats"] == 1


async def test_diverging_typing_calls_model():
    eng = FakeEngine()
    s = make(eng)
    await s.complete(req("x = "))
    await s.complete(req("x = q"))
    assert eng.calls == 2


async def test_not_ready_answers_empty_without_engine():
    s = make(None)
    out = await s.complete(req("x = "))
    assert out.text is None and out.status == "not_ready"
    # Not an answer (issue 13): `answered` counted these, flattering every count built on it.
    assert s.stats.report(s.host)["state"] == "loading" and s.stats.answered == 0
    assert s.stats.counters(s.host)["not_ready"] == 1


async def test_disabled():
    s = make(FakeEngine(), enable=False)
    assert (await s.complete(req("x = "))).status == "disabled"
    assert s.stats.answered == 0 and s.stats.counters(s.host)["disabled"] == 1


async def test_newer_request_supersedes_generating_one():
    gate = threading.Event()
    eng = FakeEngine(gate=gate, tokens_per_forward=1)
    s = make(eng)
    first = asyncio.ensure_future(s.complete(req("x = ")))
    await asyncio.to_thread(eng.started.wait, 5)
    second = asyncio.ensure_future(s.complete(req("x = y")))
    # The older answers at once while the engine is still held mid-generation.
    out1 = await asyncio.wait_for(first, 5)
    assert out1.status == "superseded" and out1.text is None
    gate.set()
    out2 = await asyncio.wait_for(second, 5)
    assert out2.status == "answered"
    await settle()
    st = s.stats
    assert st.superseded == 1 and eng.calls == 2
    # The cancelled generation stopped within one forward of the cancel: the forward that was
    # running when the cancel came (held at the gate) finished, no other started.
    assert st.wasted_target_forwards == 1
    assert st.target_forwards - st.wasted_target_forwards == out2.result.target_forwards


async def test_supersede_during_debounce_never_calls_engine():
    clock = FakeClock()
    eng = FakeEngine()
    s = make(eng, clock, debounce_ms=50)
    first = asyncio.ensure_future(s.complete(req("x = ")))
    await settle()
    second = asyncio.ensure_future(s.complete(req("x = 1")))
    await settle()
    assert (await first).status == "superseded"
    clock.advance(0.05)
    assert (await asyncio.wait_for(second, 5)).status == "answered"
    assert eng.calls == 1


async def test_queued_job_superseded_before_start_spends_nothing():
    gate = threading.Event()
    eng = FakeEngine(gate=gate)
    s = make(eng)
    a = asyncio.ensure_future(s.complete(req("x = ", key="file:///a.py")))
    await asyncio.to_thread(eng.started.wait, 5)
    b1 = asyncio.ensure_future(s.complete(req("y = ", key="file:///b.py")))  # queued behind a
    await settle()
    b2 = asyncio.ensure_future(s.complete(req("y = 2", key="file:///b.py")))
    assert (await asyncio.wait_for(b1, 5)).status == "superseded"
    gate.set()
    assert (await a).status == "answered"  # other documents are not superseded
    assert (await b2).status == "answered"
    assert eng.calls == 2  # b1 was skipped in the queue


async def test_cancel_request_sets_engine_token():
    gate = threading.Event()
    eng = FakeEngine(gate=gate, tokens_per_forward=1)
    s = make(eng)
    task = asyncio.ensure_future(s.complete(req("x = ")))
    await asyncio.to_thread(eng.started.wait, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    gate.set()
    # The worker returns promptly with a cancelled result; the next request gets the engine.
    out = await asyncio.wait_for(s.complete(req("z = ")), 5)
    assert out.status == "answered"
    st = s.stats
    assert st.cancelled == 1 and st.wasted_target_forwards == 1
    assert st.requests == 2 and st.answered == 1


async def test_engine_never_runs_concurrently():
    eng = FakeEngine(forward_s=0.001)
    s = make(eng)
    outs = await asyncio.gather(*[s.complete(req("x = ", key=f"file:///{i}.py"))
                                  for i in range(6)])
    assert all(o.status == "answered" for o in outs)  # FakeEngine raises on concurrent use


async def test_engine_error_gives_empty_answer():
    class Broken(FakeEngine):
        def generate(self, *a, **k):
            raise RuntimeError("boom")

    s = make(Broken())
    out = await s.complete(req("x = "))
    assert out.text is None and out.status == "error"
    assert s.stats.answered == 0 and s.stats.counters(s.host)["errors"] == 1


async def test_the_copy_weight_setting_reaches_the_engine():
    """copyWeight goes to generate; unset, the model's measured value (engine.scoring); with
    `exact`, 0 whatever copyWeight says."""
    from codespec_lsp.engine.scoring import Scoring

    class Recording(FakeEngine):
        scoring = Scoring(copy_weight=0.3)

        def generate(self, *a, **k):
            self.copy_weights.append(k.get("copy_weight"))
            return super().generate(*a, **k)
    eng = Recording()
    eng.copy_weights = []
    await make(eng).complete(req("x = "))
    await make(eng, copy_weight=0.0).complete(req("y = "))
    await make(eng, copy_weight=0.8).complete(req("z = "))
    await make(eng, copy_weight=0.8, exact=True).complete(req("w = "))
    assert eng.copy_weights == [0.3, 0.0, 0.8, 0.0]


async def test_the_word_bias_setting_reaches_the_engine(monkeypatch):
    """wordBias (issue 28: heal.py said 0 turns the lean off, but no setting reached it): it
    reaches the healing constraint that complete_at hands to the backend's generate."""
    from codespec_lsp.completion import complete
    from codespec_lsp.completion.heal import WORD_BIAS

    biases: list[float] = []
    real = complete.healing

    def recording(backend, heal, words=(), word_bias=WORD_BIAS):
        biases.append(word_bias)
        return real(backend, heal, words, word_bias)
    monkeypatch.setattr(complete, "healing", recording)
    from codespec_lsp.engine.scoring import Scoring
    eng = FakeEngine()
    eng.scoring = Scoring(word_bias=7.0)  # the model's measured lean, taken when the setting is unset
    await make(eng).complete(req("x = "))
    await make(eng, word_bias=0.0).complete(req("y = "))
    await make(eng, word_bias=4.0).complete(req("z = "))
    await make(eng, word_bias=4.0, exact=True).complete(req("w = "))
    assert biases == [7.0, 0.0, 4.0, 0.0]


async def test_feedback_counts_only_known_ids():
    s = make(FakeEngine())
    out = await s.complete(req("x = "))
    assert s.stats.feedback("shown", out.id)
    assert s.stats.feedback("accepted", out.id)
    assert not s.stats.feedback("accepted", "nope")
    c = s.stats.counters(s.host)
    assert c["shown"] == 1 and c["accepted"] == 1 and c["shown_acceptance_rate"] == 1.0


async def test_forget_drops_document_state():
    s = make(FakeEngine())
    await s.complete(req("x = "))
    s.forget("file:///a.py")
    await s.complete(req("x = "))
    assert s.stats.typing_through_hits == 0


async def test_reload_frees_the_old_engine():
    """Bug 4: the scheduler (calibration mark, context builder's count_tokens) kept the old
    engine alive after a reload: two model pairs in memory."""
    import gc
    import weakref

    old = FakeEngine()
    s = make(None)  # make(old)'s loader would hold it: a host holds only its current engine
    s.host.engine, s.host.state = old, "ready"
    assert (await s.complete(req("x = "))).status == "answered"
    ref = weakref.ref(old)
    s.host.engine = None  # reloading: the new pair loads while nothing else holds the old one
    del old
    gc.collect()
    assert ref() is None
    s.host.engine = FakeEngine()
    assert (await s.complete(req("x = 1"))).status == "answered"


# ------------------------------------------------------------ accounting (issue 13)


async def test_every_request_is_counted_once_by_its_outcome():
    clock = FakeClock()
    eng = FakeEngine()
    enabled = {"on": True}
    host = EngineHost(loader=lambda s: eng)
    s = Scheduler(host, lambda: Settings(debounce_ms=0, enable=enabled["on"]),
                  sleep=clock.sleep, clock=lambda: clock.now)
    assert (await s.complete(req("x = "))).status == "not_ready"
    host.engine, host.state = eng, "ready"
    assert (await s.complete(req("x = "))).status == "answered"
    assert (await s.complete(req("x = "))).status == "repeat"
    assert (await s.complete(req("x = va"))).status == "typing_through"
    enabled["on"] = False
    assert (await s.complete(req("x = "))).status == "disabled"
    enabled["on"] = True
    eng.script = lambda prompt: 1 / 0
    assert (await s.complete(req("y = "))).status == "error"
    st, c = s.stats.report(s.host), s.stats.counters(s.host)
    assert st["requests"] == 6
    assert (st["answered"], c["repeats"], st["typing_through_hits"]) == (3, 1, 1)
    assert (c["not_ready"], c["disabled"], c["errors"]) == (1, 1, 1)
    assert st["requests"] == (st["answered"] + st["cancelled"] + st["superseded"]
                              + c["not_ready"] + c["disabled"] + c["errors"])


async def test_latency_percentiles_count_only_real_answers():
    s = make(None)
    for _ in range(5):
        await s.complete(req("x = "))
    assert s.stats.report(s.host)["latency_ms_p50"] == 0.0 and not s.stats.latencies_ms


# ------------------------------------------------------------ faults in the worker


@pytest.mark.parametrize("snippets", [False, True])  # the n-gram lookup text reads them always
async def test_bad_text_in_another_document_does_not_empty_this_one(snippets):
    """Issue 13 item 5: a document holding a lone surrogate reached the tokenizer as "other
    open files" context and made every other document answer empty while it was open."""
    s = make(FakeEngine(), workspace_context=snippets)
    r = CompletionRequest("file:///a.py", "x = ", 4, others=[("bad.py", "s = '\ud800'\n")])
    out = await s.complete(r)
    assert out.status == "answered" and out.text == "value + 1"


async def test_bad_text_in_the_document_itself_is_neutralised_offsets_kept():
    s = make(FakeEngine())
    src = "s = '\ud800'\nx = "
    out = await s.complete(CompletionRequest("file:///a.py", src, len(src)))
    assert out.status == "answered" and out.text == "value + 1"


async def test_a_fault_is_logged_once_with_its_traceback_and_the_worker_goes_on(caplog):
    eng = FakeEngine()
    s = make(eng)
    eng.script = lambda prompt: 1 / 0
    with caplog.at_level(logging.DEBUG, logger="codespec_lsp.lsp.scheduler"):
        for i in range(3):
            assert (await s.complete(req(f"x{i} = "))).status == "error"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info and "ZeroDivisionError" in errors[0].message
    eng.script = lambda prompt: "value + 1\n"
    assert (await s.complete(req("z = "))).status == "answered"
    assert s.stats.counters(s.host)["errors"] == 3


async def test_a_bug_outside_the_worker_costs_one_answer_not_the_server():
    s = make(FakeEngine())
    s.cache.get = lambda *a: 1 / 0  # any bug on the event-loop side of a request
    assert (await s.complete(req("x = "))).status == "error"
    assert s.stats.counters(s.host)["errors"] == 1 and s.stats.requests == 1


async def test_feedback_with_an_object_id_is_ignored_not_an_error():
    """Issue 13 item 11: an object argument answered -32603 `unhashable type: 'dict'`."""
    s = make(FakeEngine())
    assert s.stats.feedback("accepted", {"id": "c1"}) is False
    assert s.stats.feedback("shown", ["c1"]) is False


# ------------------------------------------------------------ settings reach the worker


async def test_min_confidence_reaches_complete_at(monkeypatch):
    from codespec_lsp.lsp import scheduler
    seen = []
    real = scheduler.complete_at

    def spy(*a, **k):
        seen.append(k["min_confidence"])
        return real(*a, **k)

    monkeypatch.setattr(scheduler, "complete_at", spy)
    await make(FakeEngine()).complete(req("x = "))
    await make(FakeEngine(), min_confidence=0.25).complete(req("x = "))
    assert seen == [None, 0.25]


# ------------------------------------------------------------ the request log line


async def test_one_debug_line_per_request(caplog):
    s = make(FakeEngine())
    r = CompletionRequest("file:///a.py", "x = ", 4, request_id=7, position=(0, 4))
    with caplog.at_level(logging.DEBUG, logger="codespec_lsp.lsp.scheduler"):
        first = await s.complete(r)
        await s.complete(r)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("request ")]
    assert len(lines) == 2
    assert "id=7" in lines[0] and "file:///a.py" in lines[0] and "0:4" in lines[0]
    assert "outcome=answered" in lines[0] and f"tokens={len(first.result.tokens)} " in lines[0] and "ms=" in lines[0]
    assert first.result.tokens and "outcome=repeat" in lines[1] and "tokens=0" in lines[1]


async def test_no_request_line_above_debug(caplog):
    s = make(FakeEngine())
    with caplog.at_level(logging.INFO, logger="codespec_lsp.lsp.scheduler"):
        await s.complete(req("x = "))
    assert not [r for r in caplog.records if r.getMessage().startswith("request ")]


async def test_a_given_executor_is_the_engine_thread():
    import concurrent.futures

    pool = concurrent.futures.ThreadPoolExecutor(1, "shared")
    names = []
    eng = FakeEngine(script=lambda p: names.append(threading.current_thread().name) or "1\n")
    host = EngineHost(loader=lambda s: eng)
    host.engine, host.state = eng, "ready"
    s = Scheduler(host, lambda: Settings(debounce_ms=0), executor=pool)
    assert (await s.complete(req("x = "))).status == "answered"
    assert names and names[0].startswith("shared")
    pool.shutdown()


# ------------------------------------------------------------ the cache outlives nothing (issue 28)


async def test_a_reload_does_not_answer_the_old_models_suggestion():
    old = FakeEngine(script=lambda p: "old_model()\n")
    s = make(old)
    assert (await s.complete(req("x = "))).text == "old_model()"
    new = FakeEngine(script=lambda p: "new_model()\n")
    s.host.engine = new  # what a reload leaves behind
    out = await s.complete(req("x = "))
    assert (out.status, out.text, new.calls) == ("answered", "new_model()", 1)


@pytest.mark.parametrize("change", [dict(max_tokens=9), dict(min_confidence=0.3),
                                    dict(copy_weight=0.0), dict(preset="smol")])
async def test_a_settings_change_asks_the_model_again(change):
    eng = FakeEngine()
    cfg = {"now": Settings(debounce_ms=0)}
    host = EngineHost(loader=lambda s: eng)
    host.engine, host.state = eng, "ready"
    s = Scheduler(host, lambda: cfg["now"])
    await s.complete(req("x = "))
    assert (await s.complete(req("x = "))).status == "repeat"  # unchanged: from memory
    cfg["now"] = Settings(debounce_ms=0, **change)
    assert (await s.complete(req("x = "))).status == "answered" and eng.calls == 2


async def test_an_edit_far_above_the_cursor_inside_the_prompt_asks_again():
    filler = "".join(f"value_{i} = compute({i})\n" for i in range(300))  # ~8,000 characters
    before = "import os\n" + filler + "x = "
    eng = FakeEngine(context_window=8192)
    s = make(eng, context_tokens=4000)  # the whole file fits the prompt
    assert (await s.complete(req(before))).status == "answered"
    after = "import re\n" + filler + "x = "  # same length, same cursor, 8,000 characters above
    assert len(after) - after.index("import re") > 4096
    assert (await s.complete(req(after))).status == "answered" and eng.calls == 2


async def test_an_edit_above_the_prompt_still_answers_from_memory():
    filler = "".join(f"value_{i} = compute({i})\n" for i in range(300))
    eng = FakeEngine(context_window=8192)
    s = make(eng, context_tokens=200)  # the prompt holds only the last lines
    await s.complete(req("import os\n" + filler + "x = "))
    out = await s.complete(req("import re\n" + filler + "x = "))
    assert out.status == "repeat" and eng.calls == 1


# ------------------------------------------------------------ time budget (issue 25)

LONG_LINE = "alpha + beta + gamma + delta + epsilon\n"


async def test_time_budget_shows_whole_words_early_and_the_rest_comes_by_typing_through():
    # 30 ms a token, 80 ms budget: the answer comes after a few tokens, cut to whole words; the
    # generation goes on, and typing into the shown text is answered with the whole line.
    eng = FakeEngine(lambda p: LONG_LINE, tokens_per_forward=1, forward_s=0.03)
    s = make(eng, time_budget_ms=80)
    out = await s.complete(req("x = "))
    assert out.status == "answered" and out.text and out.text != LONG_LINE.strip()
    assert LONG_LINE.startswith(out.text) and not out.text.endswith(" ")
    assert LONG_LINE[len(out.text)] in " +"  # no half word (`alp`) is ever shown
    await idle(s)
    typed = await s.complete(req("x = " + out.text))
    assert typed.status == "typing_through" and out.text + typed.text == LONG_LINE.strip()
    assert eng.calls == 1


def test_an_early_block_shows_its_finished_lines_not_the_one_being_written(monkeypatch):
    # The clock ticks once per text the model has so far, so the deadline passes at a known
    # token: the second line's `return`, which whole words alone would show.
    from types import SimpleNamespace

    from codespec_lsp.completion import complete
    from codespec_lsp.completion.context import ContextBuilder
    block = "total = compute(alpha, beta)\n    return total + alpha\n"
    eng = FakeEngine(lambda p: block, tokens_per_forward=1)
    ticks = iter(range(10_000))
    monkeypatch.setattr(complete, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))
    source = "def f(alpha, beta):\n    "
    shown = []
    _, final = complete.complete_at(eng, ContextBuilder(eng.count_tokens, 512), "file:///a.py",
                                    source, len(source), max_tokens=64, deadline=17,
                                    early=shown.append)
    assert final == "total = compute(alpha, beta)\n    return total + alpha"  # a block is offered
    assert shown == ["total = compute(alpha, beta)"]


def test_a_blank_line_the_document_would_never_leave_is_not_suggested():
    # Under one blank line, in a file whose blank lines never come two in a row, a suggestion
    # that starts with a second starts at the cursor; where the file leaves two, it is kept.
    from codespec_lsp.completion import complete
    from codespec_lsp.completion.context import ContextBuilder
    eng = FakeEngine(lambda p: "\nconst b = 2;\n\n", tokens_per_forward=1)
    single = "const a = 1;\n\nfunction f() {}\n\n"
    double = "const a = 1;\n\n\nfunction f() {}\n\n"
    for source, expected in ((single, "const b = 2;"), (double, "\nconst b = 2;")):
        _, final = complete.complete_at(eng, ContextBuilder(eng.count_tokens, 512), "file:///a.ts",
                                        source, len(source), max_tokens=64)
        assert final == expected


async def test_without_a_budget_the_whole_suggestion_is_awaited():
    eng = FakeEngine(lambda p: LONG_LINE, tokens_per_forward=1, forward_s=0.01)
    s = make(eng, time_budget_ms=0)
    out = await s.complete(req("x = "))
    assert out.text == LONG_LINE.strip()


async def test_typing_away_from_an_early_answer_stops_its_generation():
    eng = FakeEngine(lambda p: LONG_LINE if p.endswith("x = ") else "zeta\n",
                     tokens_per_forward=1, forward_s=0.03)
    s = make(eng, time_budget_ms=60)
    first = await s.complete(req("x = "))
    assert first.text and first.text != LONG_LINE.strip()
    other = await s.complete(req("x = q"))  # not the start of the suggestion: the model again
    await idle(s)
    assert other.status == "answered" and eng.calls == 2
    # The early answer's generation was cancelled at the keystroke, not run to its end.
    assert s.stats.counters(s.host)["wasted_target_forwards"] > 0
    assert s.cache.get("file:///a.py", "x = ", 4).text == first.text  # what was shown stays
