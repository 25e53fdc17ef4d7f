"""The one error table (completer/errors.py): every EngineError code has a row, and a code that
crosses our service comes out the same whichever wire carried it (WebSocket frame or /v1 HTTP
status), with the same severity in the language server."""
from __future__ import annotations

from completer import errors
from completer.client import ERROR_CODES


def test_every_engine_code_has_one_row():
    assert set(errors.ENGINE) == set(ERROR_CODES)
    assert all(s.service in errors.SERVICE for s in errors.ENGINE.values())
    assert all(s.engine in ("", *ERROR_CODES) for s in errors.SERVICE.values())


def test_the_websocket_and_the_http_client_read_a_service_code_alike():
    for code, shape in errors.SERVICE.items():
        if not shape.engine:
            continue
        over_ws = errors.engine_code(code)
        message = "the models are still loading" if code == "not_ready" else "no"
        over_http = errors.from_http(errors.http_status(code), message)
        assert over_ws == over_http == shape.engine, code


def test_an_engine_error_keeps_its_severity_through_the_service():
    for code in ERROR_CODES:
        back = errors.engine_code(errors.service_code(code))
        assert errors.transient(back) == errors.transient(code), code


def test_unknown_codes_are_internal():
    assert errors.service_code("nonsense") == "internal"
    assert errors.engine_code("nonsense") == errors.engine_code(None) == "internal"
    assert errors.from_http(418, "teapot") == "bad_request"
    assert errors.from_http(599, "") == "internal"
    assert errors.openai_type(404) == "invalid_request_error"
    assert errors.openai_type(429) == "rate_limit_error"
