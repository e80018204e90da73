"""Prometheus text -> the server's acceptance and prefix-cache rates (pure functions)."""

from codespec_lsp.remote.metrics import parse, server_rates


def test_llama_server_draft_counters():
    text = "llamacpp:n_drafted_total 400\nllamacpp:n_drafted_accepted_total 260\n" \
           "llamacpp:requests_processing 1\n"
    rates = server_rates(text)
    assert rates["server_acceptance_rate"] == 0.65
    assert rates["server_prefix_cache_hit_rate"] is None
    assert rates["server_requests_running"] == 1


def test_counters_are_summed_over_label_sets_and_zero_drafts_mean_unknown():
    text = ('vllm:spec_decode_num_draft_tokens_total{engine="0"} 0\n'
            'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 0\n'
            'vllm:prefix_cache_queries_total{engine="0"} 10\n'
            'vllm:prefix_cache_queries_total{engine="1"} 30\n'
            'vllm:prefix_cache_hits_total{engine="0"} 10\n')
    assert parse(text)["vllm:prefix_cache_queries"] == 40
    rates = server_rates(text)
    assert rates["server_acceptance_rate"] is None
    assert rates["server_prefix_cache_hit_rate"] == 0.25


def test_no_known_counters():
    assert server_rates("process_cpu_seconds_total 3\n") == {
        "server_acceptance_rate": None, "server_prefix_cache_hit_rate": None,
        "server_requests_running": None}
