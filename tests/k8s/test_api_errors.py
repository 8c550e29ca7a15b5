"""How the operator reads the API server's errors: how long a throttled request asks it to wait (Retry-After), and
an error said in one line for its logs."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException

from attune.operator.kube import describe_error, retry_after
from tests.k8s.faultproxy import status_body

pytestmark = [pytest.mark.k8s]


def _error(code: int, headers: dict[str, str] | None = None, body: object = None) -> ApiException:
    err = ApiException(status=code, reason="Too Many Requests" if code == 429 else "Error")
    err.headers = headers or {}
    err.body = json.dumps(body).encode() if body is not None else None
    return err


def test_retry_after_comes_from_the_header_then_the_status_details() -> None:
    assert retry_after(_error(429, {"Retry-After": "3"}, status_body(429, retry_after=7))) == 3.0
    assert retry_after(_error(429, {}, status_body(429, retry_after=7))) == 7.0  # the old style, in the Status
    assert retry_after(_error(503, {"Retry-After": "2"})) == 2.0  # an aggregated API server not ready
    assert retry_after(_error(429)) is None  # throttled, no time said: the operator's own interval
    assert retry_after(_error(429, {"Retry-After": "soon"})) is None  # unreadable: never a crash
    assert retry_after(_error(500, {"Retry-After": "3"})) is None
    assert retry_after(_error(409, {"Retry-After": "3"})) is None
    assert retry_after(RuntimeError("not the API's")) is None


def test_an_api_error_is_said_in_one_line() -> None:
    err = _error(429, {"Retry-After": "3", "Audit-Id": "x"}, status_body(429, retry_after=3))
    assert describe_error(err) == "429 TooManyRequests: Too many requests, please try again later."
    assert describe_error(ValueError("bad value")) == "bad value"
    assert describe_error(TimeoutError()) == "TimeoutError"
