"""The OpenAI-compatible client (`openai:` engines) against a real server's /v1/completions:
llama-server (built by .ci/llamacpp.sh, the embedded target as GGUF). Model check, FIM format,
streaming, the in-loop stop closing the stream, API key."""
from __future__ import annotations

import json

import pytest
from helpers.llama import PREFIX, SUFFIX, TARGET, LlamaServer, llama_paths
from tokenizers import Tokenizer

from completer.client import EngineError, prompt_budget
from completer.prompt import render
from completer.remote import connect
from completer.remote.openai import OpenAI, fim_format_for


@pytest.fixture
def client(llama):
    c = OpenAI(llama.url + "/v1", fim_format="completer", timeout_ms=20000)
    c.warm_start()
    return c


@pytest.mark.slow
def test_model_format_and_budget(client):
    ctx = json.loads((TARGET / "config.json").read_text())["max_position_embeddings"]  # the server's n_ctx
    assert client.model.endswith(".gguf") and client.fmt == "completer" and client.ctx == ctx
    assert client.exact_tokens  # llama-server has /tokenize beside /v1
    tok = Tokenizer.from_file(str(TARGET / "tokenizer.json"))
    assert client.count_tokens(PREFIX) == len(tok.encode(PREFIX, add_special_tokens=False).ids)
    assert client.prompt_budget(16) == prompt_budget(ctx, 16)


@pytest.mark.slow
def test_completes_streams_and_stops(client, llama):
    deltas = []
    c = client.complete(PREFIX, SUFFIX, doc_key="o.py", max_new=300, on_text=deltas.append)
    assert c.text and "".join(deltas) == c.text and c.new_tokens == 300 and c.stop_reason == "length"
    assert c.prompt_tokens > 50 and c.extra["fim_format"] == "completer"
    before = llama.predicted_total()
    cut = client.complete(PREFIX, SUFFIX, doc_key="o.py", max_new=300, stop_text=lambda t: 3 if len(t) >= 3 else None)
    assert cut.text == c.text[:3] and cut.stop_reason == "stop"
    assert llama.predicted_total() - before < 150  # the server stopped when the stream closed
    again = client.complete(PREFIX, SUFFIX, doc_key="o.py", max_new=4)
    assert again.extra["tokens_cached"] > 50  # the server's prompt cache kept the prompt
    assert client.warmup(PREFIX + "    ", SUFFIX, doc_key="o.py") > 50


@pytest.mark.slow
def test_wrong_model_and_format_are_clear(llama):
    with pytest.raises(EngineError) as err:
        OpenAI(llama.url + "/v1", model="no-such-model", fim_format="completer").warm_start()
    assert err.value.code == "model" and "no-such-model" in err.value.message and ".gguf" in err.value.message
    with pytest.raises(EngineError) as err:  # "auto" cannot tell a format from "target-...gguf"
        connect(f"openai:{llama.url}/v1").warm_start()
    assert err.value.code == "model" and "fim_format" in err.value.message
    with pytest.raises(EngineError) as err:
        connect(f"openai:{llama.url}/v1", fim_format="bogus").warm_start()
    assert err.value.code == "bad_request" and "qwen" in err.value.message


@pytest.mark.slow
def test_api_key_required_and_sent():
    binary, gguf = llama_paths()
    s = LlamaServer(binary, gguf, "--api-key", "k-789").start()
    try:
        with pytest.raises(EngineError) as err:
            connect(f"openai:{s.url}/v1", fim_format="completer", api_key="bad-key-000").warm_start()
        assert err.value.code == "unauthorized" and "bad-key-000" not in str(err.value)
        c = connect(f"openai:{s.url}/v1", fim_format="completer", api_key="k-789")
        assert c.complete(PREFIX, SUFFIX, doc_key="k.py", max_new=2).new_tokens == 2
    finally:
        s.kill()


def test_fim_formats_by_model_name():
    assert render(fim_format_for("auto", "Qwen/Qwen2.5-Coder-1.5B"), "a", "b") == \
        "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>"
    assert fim_format_for("auto", "bigcode/starcoder2-3b") == "starcoder"
    assert render(fim_format_for("auto", "codellama/CodeLlama-7b-hf"), "a", "b") == "<PRE> a <SUF>b <MID>"
    assert fim_format_for("auto", "anything", owned_by="completer") == "suffix"
    assert fim_format_for("completer", "x.gguf") == "completer"



def test_log_probabilities_read_from_either_shape():
    """OpenAI's and vLLM's legacy `token_logprobs`, llama-server's `content` list, or none."""
    from completer.remote.openai import _token_logprobs

    legacy = {"choices": [{"text": "ab", "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.1, None]}}]}
    llama = {"choices": [{"text": "a", "logprobs": {"content": [{"token": "a", "logprob": -0.5, "bytes": [97]}]}}]}
    assert _token_logprobs(legacy) == [("a", -0.1), ("b", 0.0)]
    assert _token_logprobs(llama) == [("a", -0.5)]
    assert _token_logprobs({"choices": [{"text": "a", "logprobs": None}]}) == []
    assert _token_logprobs({"choices": [], "usage": {"completion_tokens": 3}}) == []
