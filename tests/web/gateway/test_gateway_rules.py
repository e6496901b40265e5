"""The gateway's pure parts: reading each kind's /metrics, the queue's order and reasons,
upstream URLs, prompts without a tokenizer, SSE events, and the upstream settings."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.config_sources import format_config, load_settings
from app.settings import Settings, SettingsError
from engine import SamplingParams
from web.api.structured.formats import FORMATS
from web.api.structured.parse import CallStart, ToolStream, parse_reply
from web.gateway import probe
from web.gateway import queue as rules
from web.gateway.client import ToolCalls, UpstreamError, error_message, parse_event, request_body
from web.gateway.config import GatewayConfig, UpstreamConfig, base_url
from web.gateway.handle import GatewayHandle
from web.gateway.prompt import GatewayTokenizer, UpstreamPrompt
from web.gateway.queue import GatewayRequest
from web.gateway.upstream import Upstream

VLLM = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 5.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="m"} 1200.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 1.0
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 100.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 100.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 5.0
"""
SGLANG = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 7.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 2.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.5
"""
LLAMACPP = """# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 50
"""


@pytest.mark.parametrize(("text", "kind", "running", "waiting", "kv"), [
    (VLLM, "vllm", 3, 5, 0.25), (SGLANG, "sglang", 7, 2, 0.5),
    (LLAMACPP, "llamacpp", 2, 1, None)])
def test_each_kinds_metrics(text: str, kind: str, running: float, waiting: float,
                            kv: float | None) -> None:
    samples = probe.parse_metrics(text)
    assert probe.detect_kind(samples) == kind
    f = probe.figures(kind, samples)
    assert (f.running, f.waiting, f.kv_usage) == (running, waiting, kv)


def test_vllm_counters_and_histograms_become_rates() -> None:
    up = Upstream(UpstreamConfig("http://gpu:8000", kind="vllm"))
    first = probe.figures("vllm", probe.parse_metrics(VLLM))
    assert (first.generated_total, first.ttft_sum, first.ttft_count) == (1200, 1.0, 4)
    up._rates(first)
    later = VLLM.replace("} 1200.0", "} 1300.0").replace(
        'time_to_first_token_seconds_count{engine="0",model_name="m"} 4.0',
        'time_to_first_token_seconds_count{engine="0",model_name="m"} 6.0').replace(
        'time_to_first_token_seconds_sum{engine="0",model_name="m"} 1.0',
        'time_to_first_token_seconds_sum{engine="0",model_name="m"} 2.0')
    up._rates(probe.figures("vllm", probe.parse_metrics(later)))
    assert up.tokens_per_s is not None and up.tokens_per_s > 0
    assert up.ttft == pytest.approx(0.5)  # (2.0 - 1.0) / (6 - 4): this interval's mean
    assert up.itl is None  # no new ITL samples yet


def test_garbage_metrics_are_refused() -> None:
    for garbage in ("<html>not metrics</html>", "vllm:num_requests_running{a=\"1\"}",
                    "vllm:x 1 2 3", "vllm:x one"):
        with pytest.raises(ValueError):
            probe.parse_metrics(garbage)


def test_metrics_lines_with_odd_labels_timestamps_and_nan() -> None:
    text = ('# HELP x a } tricky { comment\n'
            'vllm:num_requests_running{model_name="a b}c",engine="0"} 2.0 1700000000000\n'
            'vllm:num_requests_running{model_name="d"} 1\n'
            'vllm:kv_cache_usage_perc NaN\n'
            'vllm:x_bucket{le="+Inf"} 9\n'
            'vllm:prompt_tokens_total +Inf\n\n# EOF\n')
    assert probe.parse_metrics(text) == {"vllm:num_requests_running": 3.0,
                                         "vllm:prompt_tokens_total": float("inf")}


def test_model_info_from_each_shape() -> None:
    assert probe.model_info({"data": [{"id": "m", "max_model_len": 8192}]}) == \
        probe.ModelInfo("m", 8192, ("m",))
    assert probe.model_info({"data": [{"id": "g", "meta": {"n_ctx_train": 4096}}]}) == \
        probe.ModelInfo("g", 4096, ("g",))
    several = {"data": [{"id": "a"}, {"id": "b"}, {"object": "model"}, {"id": "a"}]}
    assert probe.model_info(several) == probe.ModelInfo("a", None, ("a", "b"))
    with pytest.raises(ValueError):
        probe.model_info({"object": "list"})


def test_upstream_urls() -> None:
    assert base_url("http://gpu1:8000/v1/") == "http://gpu1:8000"
    assert base_url(" https://x.example ") == "https://x.example"
    for bad in ("gpu1:8000", "ftp://x", "http://"):
        with pytest.raises(ValueError):
            base_url(bad)
    with pytest.raises(ValueError):
        UpstreamConfig("http://a:1", kind="tgi")
    with pytest.raises(ValueError):
        GatewayConfig((UpstreamConfig("http://a:1"), UpstreamConfig("http://a:1/v1")))


def _req(rid: str, owner: str, arrival: float, model: str = "m") -> GatewayRequest:
    return GatewayRequest(rid, owner, [1], SamplingParams(max_tokens=1),
                          GatewayHandle(rid, owner, 1, lambda _i, _r: False), model,
                          arrival=arrival)


def test_fair_order_takes_turns_and_the_user_cap_waits_apart() -> None:
    waiting = [_req("a1", "ann", 1), _req("a2", "ann", 2), _req("a3", "ann", 3),
               _req("b1", "bob", 4), _req("c1", "cy", 5)]
    plan = rules.plan(waiting, "fair", {"ann": 1}, {"ann": 1}, None)
    assert [r.id for r in plan.order] == ["b1", "c1", "a1", "a2", "a3"]
    plan = rules.plan(waiting, "fifo", {"ann": 1}, {}, None)
    assert [r.id for r in plan.order] == ["a1", "a2", "a3", "b1", "c1"]
    plan = rules.plan(waiting, "fair", {}, {"ann": 1}, 2)  # ann has one in flight, cap 2
    assert [r.id for r in plan.order] == ["a1", "b1", "c1"]
    assert [r.id for r in plan.user_limited] == ["a2", "a3"]
    ups = [Upstream(UpstreamConfig("http://a:1", max_in_flight=64)),
           Upstream(UpstreamConfig("http://b:1", max_in_flight=64))]
    for up in ups:
        up.in_flight = {f"x{i}" for i in range(64)}
    reasons = rules.reasons(plan, lambda _m: ups, False, 2)
    assert reasons["a1"].code == "upstream-busy"
    assert reasons["a1"].text == "all 2 upstreams at their 64-request cap"
    assert reasons["b1"].code == "behind" and reasons["a2"].code == "user-limit"
    assert rules.choose_upstream(ups, set()) is None
    ups[1].in_flight.pop()
    assert rules.choose_upstream(ups, set()) is ups[1]
    ups[0].mark("down", "refused")
    ups[1].mark("down", "refused")
    assert rules.head_reason(ups).code == "upstream-down"


def test_routes_by_model_and_each_model_waits_on_its_own_upstreams() -> None:
    a, b, c = (Upstream(UpstreamConfig(f"http://{n}:1", max_in_flight=1)) for n in "abc")
    a.models, b.models, c.models = ("small",), ("big", "big-lora"), ("big",)
    assert {m: [u.name for u in ups] for m, ups in rules.served([a, b, c]).items()} == \
        {"small": ["a:1"], "big": ["b:1", "c:1"], "big-lora": ["b:1"]}
    assert rules.routes([a, b, c], "big", "small") == [b, c]
    assert rules.routes([a, b, c], "nope", "small") == []
    fresh = Upstream(UpstreamConfig("http://d:1"))  # its list not read yet
    assert rules.routes([fresh], "small", "small") == [fresh]  # the default goes anywhere
    assert rules.routes([fresh], "big", "small") == []
    b.in_flight, c.in_flight = {"x"}, {"y"}  # big's upstreams are full, small's is free
    waiting = [_req("b1", "ann", 1, "big"), _req("b2", "bob", 2, "big"),
               _req("s1", "cy", 3, "small"), _req("n1", "dee", 4, "nope")]
    plan = rules.plan(waiting, "fifo", {}, {}, None)

    def route(model: str) -> list[Upstream]:
        return rules.routes([a, b, c], model, "small")

    reasons = rules.reasons(plan, route, True, None)
    assert (reasons["b1"].code, reasons["b1"].text) == \
        ("upstream-busy", "all 2 upstreams at their 1-request cap (for big)")
    assert (reasons["b2"].code, reasons["b2"].text) == ("behind", "behind 1 earlier request "
                                                        "(b1 first)")
    assert reasons["s1"].text.endswith("(for small)")
    assert (reasons["n1"].code, reasons["n1"].text) == ("upstream-down",
                                                        "no upstream serves nope now")
    assert rules.choose_upstream(route("small"), set()) is a
    assert rules.choose_upstream(route("big"), set()) is None


def test_least_loaded_uses_the_upstreams_own_figures() -> None:
    a, b = Upstream(UpstreamConfig("http://a:1", max_in_flight=8)), \
        Upstream(UpstreamConfig("http://b:1", max_in_flight=8))
    a.figures = probe.Figures(running=6, waiting=1)  # busy with other clients' work
    assert rules.choose_upstream([a, b], set()) is b
    assert rules.choose_upstream([a, b], {"b:1"}) is a  # b refused this request before


def test_prompts_without_a_tokenizer() -> None:
    tok = GatewayTokenizer()
    chat = tok.apply_chat_template([{"role": "user", "content": "hello there"}])
    assert chat.messages == [{"role": "user", "content": "hello there"}] and len(chat) >= 4
    cont = chat + tok.encode("Once")
    assert isinstance(cont, UpstreamPrompt) and cont.continued == "Once"
    assert chat + [] is chat
    path, body = request_body(cont, SamplingParams(max_tokens=5, stop=("x",)), "m", "vllm",
                              "r1")
    assert path == "/v1/chat/completions" and body["continue_final_message"] is True
    assert body["messages"][-1] == {"role": "assistant", "content": "Once"}
    cont.extra = {"model": "asked", "tools": []}  # type: ignore[attr-defined]
    path, body = request_body(cont, SamplingParams(max_tokens=5), "routed", "ferry", "r1")
    assert body["model"] == "routed" and body["tools"] == []  # the route names the model
    assert "speculative" not in body  # drafts as the upstream decides
    path, body = request_body([5, 6], SamplingParams(max_tokens=2), "m", "sglang", "r2")
    assert path == "/v1/completions" and body["prompt"] == [5, 6] and body["rid"] == "r2"
    # drafts turned off at the front stay off on a Ferry upstream; others never see the field
    plain = SamplingParams(max_tokens=2, speculative=False)
    assert request_body([5, 6], plain, "m", "ferry", "r3")[1]["speculative"] is False
    assert "speculative" not in request_body([5, 6], plain, "m", "vllm", "r4")[1]
    assert tok.decode(tok.encode("echo me")) == "echo me"


def test_stream_events_and_errors() -> None:
    chunk = parse_event('{"choices":[{"delta":{"content":"Hi"},"finish_reason":null}]}', "u")
    assert chunk is not None and chunk.text == "Hi"
    thought = parse_event('{"choices":[{"delta":{"reasoning_content":"Hm."}}]}', "u")
    assert thought is not None and (thought.text, thought.reasoning) == ("", "Hm.")
    usage = parse_event('{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3}}',
                        "u")
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (9, 3)
    assert parse_event("[DONE]", "u") is None
    for garbage in ("<html>", "[1, 2]", '{"error": {"message": "boom"}}'):
        with pytest.raises(UpstreamError):
            parse_event(garbage, "u")
    assert error_message(400, b'{"error": {"message": "too long"}}') == "too long"
    assert error_message(502, b"Bad Gateway") == "Bad Gateway"


def test_upstream_settings(tmp_path: Path) -> None:
    given: list[Any] = ["http://a:8000/v1", {"url": "http://b:9000", "kind": "sglang",
                                             "max_in_flight": 32, "api_key": "sk-1"}]
    s = Settings(upstreams=given)  # a bare URL is accepted and becomes {url = ...}
    assert s.upstreams[0] == {"url": "http://a:8000/v1"}
    bads: list[list[Any]] = [[{"url": "http://a:1", "colour": "red"}], [{"kind": "vllm"}],
                             ["a:1"], [{"url": "http://a:1", "max_in_flight": 0}],
                             ["http://a:1", "http://a:1/v1"]]
    for bad in bads:
        with pytest.raises(SettingsError):
            Settings(upstreams=bad)
    config = tmp_path / "ferry.toml"
    config.write_text('upstreams = [{url = "http://gpu1:8000", api_key = "sk-secret", '
                      'kind = "vllm", max_in_flight = 16}]\n')
    loaded = load_settings({}, env={"FERRY_HOME": str(tmp_path)}, config_file=config)
    assert loaded.upstreams == [{"url": "http://gpu1:8000", "api_key": "sk-secret",
                                 "kind": "vllm", "max_in_flight": 16}]
    printed = format_config(loaded, config)
    assert "sk-secret" not in printed and 'url = "http://gpu1:8000"' in printed
    env = load_settings({}, env={"FERRY_HOME": str(tmp_path),
                                 "FERRY_UPSTREAMS": "http://a:1, http://b:2"})
    assert [u["url"] for u in env.upstreams] == ["http://a:1", "http://b:2"]


def test_upstream_flag_is_repeatable(tmp_path: Path) -> None:
    from app.cli import build_parser, serve_flags
    args = build_parser().parse_args(["serve", "--upstream", "http://a:1",
                                      "--upstream", "http://b:2/v1"])
    settings = load_settings(serve_flags(args), env={"FERRY_HOME": str(tmp_path)})
    assert [u["url"] for u in settings.upstreams] == ["http://a:1", "http://b:2/v1"]
    assert settings.source("upstreams") == "flag --upstream"


def test_print_config_shows_the_upstreams(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli import main
    monkeypatch.setenv("FERRY_HOME", str(tmp_path))
    assert main(["serve", "--upstream", "http://gpu1:8000/v1", "--print-config"]) == 0
    assert 'upstreams = [{url = "http://gpu1:8000/v1"}]' in capsys.readouterr().out
    assert main(["serve", "--upstream", "gpu1:8000", "--print-config"]) == 2
    assert "upstreams[0]" in capsys.readouterr().err


def test_an_upstreams_tool_calls_are_handed_on_as_they_stream() -> None:
    """The front writes an upstream's call deltas as generic-format text at once, so its own
    reader streams the arguments on (and ends each call valid)."""
    calls, names = ToolCalls(), frozenset({"add", "get_weather"})
    reader = ToolStream(FORMATS["generic"], names)
    text = calls.add(((0, "add", ""),))
    assert text == ""  # the name alone: the block waits for the arguments
    text += calls.add(((0, "", '{"a": 1'),))
    assert reader.push(text)[0] == CallStart("add")  # the call starts before the upstream ends
    text += calls.add(((0, "", ', "b": 2}'), (1, "get_weather", "")))
    text += calls.close()
    assert parse_reply(text, FORMATS["generic"], names)[1] == [
        parse_reply('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>',
                    FORMATS["generic"], names)[1][0],
        parse_reply('<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>',
                    FORMATS["generic"], names)[1][0]]
