"""scripts/gpu_bench.py runs end to end on CPU with tiny configs, so the H200 run is a formality."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_bench.py"


@pytest.fixture(scope="module")
def gpu_bench():
    spec = importlib.util.spec_from_file_location("gpu_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_nominal_bandwidth_by_device_name(gpu_bench):
    nb = gpu_bench.nominal_bandwidth
    assert nb("NVIDIA H200") == 4.8e12
    assert nb("NVIDIA H100 80GB HBM3") == 3.35e12
    assert nb("NVIDIA A100-SXM4-80GB") == 2.0e12
    assert nb("NVIDIA A10") == 0.6e12  # not mistaken for an A100
    assert nb("NVIDIA GeForce RTX 4090") == pytest.approx(1.0e12, rel=0.01)
    assert nb("Some Future Card") is None


def test_tiny_run_on_cpu_writes_the_figures(gpu_bench, tmp_path):
    out = tmp_path / "bench.json"
    assert gpu_bench.main(["--tiny", "--device", "cpu", "--out", str(out), "--reps", "1", "--warmup", "1"]) == 0
    r = json.loads(out.read_text())
    for key in ("device_name", "target_forward_ms", "draft_forward_ms", "cost_ratio", "prefill_ms",
                "achieved_bandwidth_bytes_per_s", "nominal_bandwidth_bytes_per_s", "bandwidth_fraction",
                "versions", "wall_s"):
        assert key in r, key
    assert set(r["target_forward_ms"]) == {"512", "2048"}
    for per_n in r["target_forward_ms"].values():
        assert list(per_n) == [str(n) for n in range(1, 9)] and all(ms > 0 for ms in per_n.values())
    for ctx, ms in r["draft_forward_ms"].items():
        assert r["cost_ratio"][ctx] == pytest.approx(ms / r["target_forward_ms"][ctx]["1"], rel=1e-3)
        bytes_read = r["draft"]["streamed_weight_bytes"] + r["draft"]["kv_bytes_per_token"] * int(ctx)
        assert r["achieved_bandwidth_bytes_per_s"]["draft"][ctx] == pytest.approx(bytes_read / (ms / 1e3), rel=1e-3)
    assert r["prefill_ms"]["target"] and all(ms > 0 for ms in r["prefill_ms"]["target"].values())
    assert r["nominal_bandwidth_bytes_per_s"] is None and r["dtype"] == "float32"
    assert r["target"]["params"] > r["draft"]["params"]
