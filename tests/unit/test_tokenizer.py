"""The proxy side of sealed tokens (proxy/tokenizer.py), in process."""

from __future__ import annotations

from proxy.tokenizer import TokenRequest


def test_token_request_repr_hides_proxy_authorization() -> None:
    request = TokenRequest("bot-1", "agent", "api.test", 443, "GET", "/", ["Bearer canary-7f3a"])
    assert "canary-7f3a" not in repr(request) and "canary-7f3a" not in str(request)
    assert request.proxy_authorization == ["Bearer canary-7f3a"]  # the value itself is intact
