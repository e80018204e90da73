"""doctor --launch: the command that serves a pair with speculation, from the plan's own numbers."""

import json
import shlex

from codespec_lsp.planning import doctor
from codespec_lsp.cli import main

GiB = 2**30
CL7, CL13 = "TheBloke/CodeLlama-7B-Python-GPTQ", "TheBloke/CodeLlama-13B-Python-GPTQ"


def run_json(capsys, *argv) -> dict:
    assert main(["doctor", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def flag(parts: list[str], name: str) -> str:
    return parts[parts.index(name) + 1]


def test_vllm_command_for_the_gptq_codellama_pair(capsys):
    out = run_json(capsys, "--draft", CL7, "--target", CL13, "--gpu-mem", "24GiB", "--launch", "vllm")
    parts = shlex.split(out["launch_command"])
    assert parts[:3] == ["vllm", "serve", CL13]
    spec = json.loads(flag(parts, "--speculative-config"))
    assert spec == {"method": "draft_model", "model": CL7, "num_speculative_tokens": max(out["best_k"], 1)}
    assert int(flag(parts, "--max-model-len")) == min(4096, out["max_context"])
    assert 0.1 <= float(flag(parts, "--gpu-memory-utilization")) <= 0.95
    assert flag(parts, "--quantization") == "gptq"


def test_the_context_never_exceeds_the_plans_max_and_k_is_at_least_one():
    p, info = doctor.diagnose(CL7, CL13, 16 * GiB, 100_000, k=0)
    parts = shlex.split(doctor.launch_command("vllm", p, info))
    assert int(flag(parts, "--max-model-len")) == p.max_context < 100_000
    assert json.loads(flag(parts, "--speculative-config"))["num_speculative_tokens"] >= 1
    # a fuller card needs a larger share of it
    small = float(flag(parts, "--gpu-memory-utilization"))
    p2, info2 = doctor.diagnose(CL7, CL13, 80 * GiB, 4096)
    assert float(flag(shlex.split(doctor.launch_command("vllm", p2, info2)),
                      "--gpu-memory-utilization")) < small


def test_llama_server_command(capsys):
    out = run_json(capsys, "--draft", CL7, "--target", CL13, "--launch", "llama-server")
    parts = shlex.split(out["launch_command"])
    assert parts[0] == "llama-server"
    assert flag(parts, "-m").endswith(".gguf") and flag(parts, "-md").endswith(".gguf")
    assert int(flag(parts, "--spec-draft-n-max")) == max(out["best_k"], 1)
    assert int(flag(parts, "-c")) <= out["max_context"] and "--cache-reuse" in parts


def test_the_embedded_pair_is_served_from_its_folders(capsys):
    assert main(["doctor", "--draft", "tiny", "--target", "tiny", "--context", "1024",
                 "--launch", "vllm"]) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if x.startswith("launch"))
    parts = shlex.split(line.removeprefix("launch").strip())
    assert parts[2].endswith("models/tiny/target") and "--quantization" not in parts
    assert json.loads(flag(parts, "--speculative-config"))["model"].endswith("models/tiny/draft")
    assert flag(parts, "--max-model-len") == "1024"


def test_no_launch_flag_no_field_and_a_pair_that_never_fits_gets_none(capsys):
    assert "launch_command" not in run_json(capsys, "--draft", CL7, "--target", CL13)
    out = run_json(capsys, "--draft", CL7, "--target", CL13, "--gpu-mem", "4GiB", "--launch", "vllm")
    assert out["launch_command"] is None
