import asyncio
import math
import threading

import pytest

from codespec_lsp.config import Settings
from codespec_lsp.engine.api import ModelLoadError
from codespec_lsp.lsp.host import EngineHost
from codespec_lsp.lsp.scheduler import CompletionRequest, Scheduler
from fake_engine import FakeEngine


async def settle(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def req(source):
    return CompletionRequest("file:///a.py", source, len(source))


# ------------------------------------------------------------ loading


async def test_host_loads_and_reports():
    eng = FakeEngine()
    host = EngineHost(loader=lambda s: eng)
    done = []
    await host.load(Settings(), on_done=done.append)
    assert host.state == "ready" and host.engine is eng
    assert done[0].ok and "fake-target" in done[0].message
    assert not host.needs_load(Settings(max_tokens=5))  # not a model setting
    assert host.needs_load(Settings(preset="other"))


async def test_load_calibrates_the_rhythm_with_a_warm_generation():
    eng = FakeEngine()
    host = EngineHost(loader=lambda s: eng)
    await host.load(Settings())
    tokens, wall_s, prefill = host.warmup
    assert tokens > 0 and prefill <= 2  # the second, warm call: a keystroke's cost
    s = Scheduler(host, lambda: Settings(debounce_ms=0))
    assert s.rhythm.cost() is None
    await s.complete(req("x = "))
    assert s.rhythm.cost() is not None


async def test_host_load_failure_keeps_message():
    def loader(s):
        raise ModelLoadError("no such folder: /nope")

    host = EngineHost(loader=loader)
    done = []
    await host.load(Settings(target="/nope"), on_done=done.append)
    assert host.state == "error" and "no such folder" in host.error
    assert not done[0].ok and "no such folder" in done[0].message


async def test_host_unexpected_error_and_oom_hint():
    def loader(s):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")

    host = EngineHost(loader=loader)
    done = []
    await host.load(Settings(), on_done=done.append)
    assert host.state == "error" and "smaller or GPTQ" in done[0].message


async def test_burst_of_model_changes_loads_latest_once_more():
    release = threading.Event()
    loaded = []

    def loader(s):
        release.wait(5)
        loaded.append(s.preset)
        return FakeEngine()

    host = EngineHost(loader=loader)
    first = asyncio.ensure_future(host.load(Settings(preset="a")))
    await settle()
    for p in "bcd":
        await host.load(Settings(preset=p))  # returns at once: a load is running
    release.set()
    await asyncio.wait_for(first, 5)
    assert loaded == ["a", "d"] and host.state == "ready"


def _fake_planner(monkeypatch, plan: dict) -> list:
    from codespec_lsp.planning import doctor
    calls = []

    def plan_pair(draft, target, gpu_mem_bytes, context, k=None, acceptance=None, engine=None):
        calls.append((draft, target, gpu_mem_bytes, context, engine))
        return plan

    monkeypatch.setattr(doctor, "plan_pair", plan_pair)
    return calls


async def test_planner_warning_when_pair_will_not_speed_up(monkeypatch):
    calls = _fake_planner(monkeypatch, {"fits": True, "expected_speedup": 0.8,
                                        "verdict": "slower", "advice": "use n-gram drafting"})
    host = EngineHost(loader=lambda s: FakeEngine())
    done = []
    await host.load(Settings(), on_done=done.append)
    assert done[0].ok and "n-gram" in done[0].warning and "0.80" in done[0].warning
    assert calls[0][:2] == ("fake-draft", "fake-target") and calls[0][2] > 0
    assert calls[0][4] is None  # from configs: no engine work off the worker thread


async def test_planner_warning_when_pair_will_not_fit(monkeypatch):
    _fake_planner(monkeypatch, {"fits": False, "expected_speedup": 2.0, "verdict": "no",
                                "advice": "pick the GPTQ preset"})
    host = EngineHost(loader=lambda s: FakeEngine())
    done = []
    await host.load(Settings(), on_done=done.append)
    assert "will not fit" in done[0].warning and "GPTQ" in done[0].warning


async def test_missing_or_failing_planner_never_breaks_loading(monkeypatch):
    from codespec_lsp.planning import doctor
    def failing(*args, **kwargs):
        raise ValueError("unknown model")

    monkeypatch.setattr(doctor, "plan_pair", failing)
    host = EngineHost(loader=lambda s: FakeEngine())
    done = []
    await host.load(Settings(), on_done=done.append)
    assert done[0].ok and done[0].warning is None and host.state == "ready"




# ------------------------------------------------------------ first forward (issue 13, item 16)


async def test_nan_weights_are_a_load_error_not_ready():
    """A model whose first forward gives NaN loaded as "ready" and answered empty forever."""
    host = EngineHost(loader=lambda s: FakeEngine(logprob=float("nan")))
    done = []
    await host.load(Settings(), on_done=done.append)
    assert host.state == "error" and host.engine is None
    assert not done[0].ok and "NaN" in done[0].message and "NaN" in host.error


async def test_infinite_logprobs_are_a_load_error_too():
    host = EngineHost(loader=lambda s: FakeEngine(logprob=math.inf))
    await host.load(Settings())
    assert host.state == "error"


async def test_first_forward_that_raises_is_a_load_error():
    class Broken(FakeEngine):
        def generate(self, *a, **k):
            raise RuntimeError("CUDA error: an illegal memory access")

    host = EngineHost(loader=lambda s: Broken())
    done = []
    await host.load(Settings(), on_done=done.append)
    assert host.state == "error" and "illegal memory access" in done[0].message


async def test_remote_backend_calibration_failure_is_not_a_load_error():
    class Busy(FakeEngine):
        kind = "vllm"

        def generate(self, *a, **k):
            raise ConnectionError("server restarting")

    host = EngineHost(loader=lambda s: Busy())
    await host.load(Settings())
    assert host.state == "ready" and host.warmup is None


async def test_a_good_load_after_a_nan_one_is_ready():
    engines = iter([FakeEngine(logprob=float("nan")), FakeEngine()])
    host = EngineHost(loader=lambda s: next(engines))
    await host.load(Settings(target="a"))
    assert host.state == "error"
    await host.load(Settings(target="b"))
    assert host.state == "ready" and host.error is None


def test_real_pair_with_nan_weights_is_a_load_error():
    """The embedded pair with its target's weights set to NaN, as a broken checkpoint loads."""
    torch = pytest.importorskip("torch")
    from codespec_lsp.engine import load_engine

    def loader(settings):
        engine = load_engine(preset="tiny", device="cpu")
        with torch.no_grad():
            for p in engine.target_model.parameters():
                p.fill_(float("nan"))
        return engine

    host = EngineHost(loader=loader)
    asyncio.run(host.load(Settings()))
    assert host.state == "error" and "NaN" in host.error


# ------------------------------------------------------------ readiness (issue 12, item 2)


async def test_on_ready_is_called_once_after_a_good_load_and_after_on_done():
    calls = []
    host = EngineHost(loader=lambda s: FakeEngine(), on_ready=lambda: calls.append(host.state))
    await host.load(Settings(), on_done=lambda o: calls.append("done"))
    assert calls == ["done", "ready"]


async def test_on_ready_may_be_a_coroutine_and_is_not_called_on_failure():
    calls = []

    async def ready():
        calls.append("ready")

    host = EngineHost(loader=lambda s: FakeEngine(logprob=float("nan")), on_ready=ready)
    await host.load(Settings())
    assert calls == []
    host._loader = lambda s: FakeEngine()
    await host.load(Settings(target="other"))
    assert calls == ["ready"]


async def test_on_ready_waits_for_the_last_of_a_burst():
    release = threading.Event()
    calls = []

    def loader(s):
        release.wait(5)
        return FakeEngine()

    host = EngineHost(loader=loader, on_ready=lambda: calls.append(host._loaded_key[0]))
    first = asyncio.ensure_future(host.load(Settings(preset="a")))
    await settle()
    await host.load(Settings(preset="b"))
    release.set()
    await asyncio.wait_for(first, 5)
    assert calls == ["b"]  # not "a": the client would ask a pair that is about to go


async def test_failing_on_ready_does_not_break_loading():
    def boom():
        raise BrokenPipeError("client gone")

    host = EngineHost(loader=lambda s: FakeEngine(), on_ready=boom)
    await host.load(Settings())
    assert host.state == "ready"
