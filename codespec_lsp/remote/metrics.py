"""Rates read off a server's Prometheus `/metrics` text: pure functions, no HTTP.

Promises: `server_rates(text)` returns `server_acceptance_rate` (accepted / drafted tokens of the
server's own speculative decoding) and `server_prefix_cache_hit_rate` (prompt tokens served from
its prefix cache / prompt tokens looked up), each None when the server does not export the
counters (no speculation configured, llama-server without `--metrics`, ...). The counters are the
server's totals since it started: on a shared server they describe everyone's traffic.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

# (numerator, denominator) counter names per rate, in the order they are tried. vLLM's names are
# the tested ones (its CPU build serving the embedded pair); llama.cpp's are as builds export them (llama.cpp has no prefix-cache counters).
ACCEPTANCE = (
    ("vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_draft_tokens"),
    ("llamacpp:n_drafted_accepted", "llamacpp:n_drafted"),
    ("llamacpp:n_draft_accepted", "llamacpp:n_draft"),
)
PREFIX_CACHE = (
    ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries"),
    ("vllm:gpu_prefix_cache_hits", "vllm:gpu_prefix_cache_queries"),
)
RUNNING = ("vllm:num_requests_running", "llamacpp:requests_processing")


def parse(text: str) -> dict[str, float]:
    """{sample name without `_total`: value summed over label sets (several engines or models)}."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if sample.name.endswith(("_created", "_bucket")):
                continue
            totals[name] = totals.get(name, 0.0) + float(sample.value)
    return totals


def _rate(totals: dict[str, float], pairs: tuple[tuple[str, str], ...]) -> float | None:
    for num, den in pairs:
        if num in totals and den in totals:
            return round(totals[num] / totals[den], 4) if totals[den] else None
    return None


def server_rates(text: str) -> dict[str, float | None]:
    totals = parse(text)
    running = next((totals[n] for n in RUNNING if n in totals), None)
    return {
        "server_acceptance_rate": _rate(totals, ACCEPTANCE),
        "server_prefix_cache_hit_rate": _rate(totals, PREFIX_CACHE),
        "server_requests_running": running,
    }
