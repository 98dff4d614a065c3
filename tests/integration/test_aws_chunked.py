"""Chunk-signed uploads (`STREAMING-AWS4-HMAC-SHA256-PAYLOAD`, aws-chunked) through the proxy,
re-signed chunk by chunk as they stream, for the fake AWS that checks every chunk's signature
with the real keys (tests/awsfake.py): over HTTP/1 and HTTP/2, paused halfway, broken halfway.
The world is test_aws_sigv4's: boto3's placeholder keys in the sandbox, the real keys brokered
(sandbox aws-1) or sealed in a token (tokens-1)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.dnsstub import StubDNS
from tests.harness import OriginCA
from tests.sdk.kit import FakeAPI, World

pytest.importorskip("boto3", reason="boto3 is not installed (pip install -e '.[test]')")

from sealgate.credentials.processors import AWS_PLACEHOLDER_KEY_ID
from tests.awsfake import AwsFake
from tests.integration.test_aws_sigv4 import (
    CLIENT,
    KEYS,
    S3,
    aws_env,
    aws_world,
    run_refused,
    sealed_env,
)
from tests.security.rawclient import (
    TIMEOUT,
    h2_through_tunnel,
    open_tunnel,
    proxy_auth,
    read_response,
    request_bytes,
    tls_wrap,
)


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory, test_ca: OriginCA, dns: StubDNS
      ) -> Iterator[World]:
    with aws_world(tmp_path_factory.mktemp("aws-chunked"), test_ca, dns) as made:
        yield made


@pytest.fixture(autouse=True)
def _fresh(w: World) -> None:
    w.fake.reset()


CHUNKED = """
def main(s3, mode):
    import datetime, requests
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    auth = ("AWS4-HMAC-SHA256 Credential=SEALGATEPLACEHOLDER/" + stamp[:8] +
            "/us-east-1/s3/aws4_request, SignedHeaders=content-encoding;host;"
            "x-amz-content-sha256;x-amz-date;x-amz-decoded-content-length, Signature=" + "0" * 64)
    # Signed by the sandbox with the placeholder keys: the proxy never checks these.
    body = b"".join(b"%x;chunk-signature=%s\\r\\n%s\\r\\n" % (len(c), b"0" * 64, c)
                    for c in (b"x" * 70000, b"hello", b""))
    r = requests.put(s3 + "/bkt/streamed", data=body,
                     headers={"Authorization": auth, "X-Amz-Date": stamp,
                              "Content-Encoding": "aws-chunked",
                              "X-Amz-Decoded-Content-Length": "70005",
                              "X-Amz-Content-SHA256": mode}, timeout=20)
    got = None
    if r.status_code == 200:
        got = len(client("s3", s3).get_object(Bucket="bkt", Key="streamed")["Body"].read())
    return {"status": r.status_code, "reason": r.headers.get("x-sealgate-error"),
            "text": r.text, "got": got}
"""


def test_a_chunk_signed_upload_is_re_signed_chunk_by_chunk(w: World) -> None:
    out = w.run(CLIENT + CHUNKED, aws_env(w, "aws-1"), s3=w.url(host=S3),
                mode="STREAMING-AWS4-HMAC-SHA256-PAYLOAD").ok()
    assert out["status"] == 200 and out["got"] == 70005, out
    fake: AwsFake = w.aws  # type: ignore[attr-defined]
    assert "s3 PUT /bkt/streamed" in fake.verified  # every chunk's signature checked


MANY_CHUNKS = """
def main(s3, key, sizes, broken):
    import datetime, requests
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    auth = ("AWS4-HMAC-SHA256 Credential=SEALGATEPLACEHOLDER/" + stamp[:8] +
            "/us-east-1/s3/aws4_request, SignedHeaders=content-encoding;host;"
            "x-amz-content-sha256;x-amz-date;x-amz-decoded-content-length, Signature=" + "0" * 64)
    chunks = [bytes([65 + i % 26]) * n for i, n in enumerate(sizes)] + [b""]
    # `broken`: the second chunk says it is one byte longer than it is.
    body = b"".join(b"%x;chunk-signature=%s\\r\\n%s\\r\\n" % (
        len(c) + (1 if broken and i == 1 else 0), b"0" * 64, c) for i, c in enumerate(chunks))
    try:
        r = requests.put(s3 + "/bkt/" + key, data=body,
                         headers={"Authorization": auth, "X-Amz-Date": stamp,
                                  "Content-Encoding": "aws-chunked",
                                  "X-Amz-Decoded-Content-Length": str(sum(sizes)),
                                  "X-Amz-Content-SHA256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"},
                         timeout=30)
        status = r.status_code
    except requests.RequestException:
        status = 0  # the proxy cut the upload off
    got = None
    if status == 200:
        got = len(client("s3", s3).get_object(Bucket="bkt", Key=key)["Body"].read())
    return {"status": status, "got": got}
"""


def test_a_large_chunk_signed_upload_streams_through_re_signed(w: World) -> None:
    """4 MiB in 64 KiB chunks, re-signed (that it streams, under the request budget, only the
    paused upload below can tell)."""
    sizes = [65536] * 64
    out = w.run(CLIENT + MANY_CHUNKS, aws_env(w, "aws-1"), s3=w.url(host=S3), key="big",
                sizes=sizes, broken=False).ok()
    assert out == {"status": 200, "got": sum(sizes)}
    fake: AwsFake = w.aws  # type: ignore[attr-defined]
    assert "s3 PUT /bkt/big" in fake.verified


def _chunk_signed(chunks: list[bytes]) -> tuple[list[tuple[str, str]], bytes]:
    """A chunk-signed upload of `chunks` as the sandbox signs it, with the placeholder keys
    (zeros: the proxy never checks them): its SigV4 headers, and its body with the final
    chunk."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    auth = (f"AWS4-HMAC-SHA256 Credential={AWS_PLACEHOLDER_KEY_ID}/{stamp[:8]}/us-east-1/s3/"
            "aws4_request, SignedHeaders=content-encoding;host;x-amz-content-sha256;"
            f"x-amz-date;x-amz-decoded-content-length, Signature={'0' * 64}")
    body = b"".join(b"%x;chunk-signature=%s\r\n%s\r\n" % (len(c), b"0" * 64, c)
                    for c in [*chunks, b""])
    return [("authorization", auth), ("x-amz-date", stamp), ("content-encoding", "aws-chunked"),
            ("x-amz-decoded-content-length", str(sum(map(len, chunks)))),
            ("x-amz-content-sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"),
            ("content-length", str(len(body)))], body


def test_a_chunk_signed_upload_reaches_the_origin_re_signed_while_the_client_is_sending(
    w: World,
) -> None:
    """The client stops halfway: re-signed chunks are at the fake before it sends the rest (a
    proxy that buffered the body, whatever its size, would have sent the fake nothing yet)."""
    fake = w.fake
    assert isinstance(fake, FakeAPI)
    chunks = [bytes([65 + i]) * 65536 for i in range(8)]
    headers, body = _chunk_signed(chunks)
    target = f"{S3}:{fake.port}"
    sock, tunnel = open_tunnel(w.proxy.port, target, [
        ("Proxy-Authorization", proxy_auth("aws-1", KEYS["aws-1"]))])
    with sock, tls_wrap(sock, S3, w.proxy.ca) as tls:
        assert tunnel.status == 200
        tls.sendall(request_bytes("PUT", "/bkt/paused", [("Host", target), *headers])
                    + body[:len(body) // 2])
        # The first four chunks have been sent whole: the proxy holds only one still coming.
        framed = (len(body) - len(_chunk_signed([])[1])) // len(chunks) * 4
        deadline = time.monotonic() + TIMEOUT
        while len(fake.arriving) < framed and time.monotonic() < deadline:
            time.sleep(0.02)
        early = bytes(fake.arriving)
        assert len(early) >= framed, f"{len(early)} bytes at the fake before the rest was sent"
        tls.sendall(body[len(body) // 2:])
        answer = read_response(tls)
    assert answer.status == 200, answer
    aws: AwsFake = w.aws  # type: ignore[attr-defined]
    assert "s3 PUT /bkt/paused" in aws.verified and aws.objects["/bkt/paused"] == b"".join(chunks)
    # What came early is the start of the body that verified: re-signed chunks, not the
    # sandbox's zeros.
    assert fake.last().body.startswith(early) and b"0" * 64 not in early


def test_an_empty_http2_data_frame_in_a_chunk_signed_upload_is_not_its_end(w: World) -> None:
    """HTTP/2 lets a client send an empty DATA frame anywhere; the re-signer reads b"" as the
    body's end, so mitmproxy's event for it must never reach it."""
    chunks = [bytes([97 + i]) * 5000 for i in range(6)]
    headers, body = _chunk_signed(chunks)
    frames = [body[at:at + 8192] for at in range(0, len(body), 8192)]
    frames.insert(len(frames) // 2, b"")
    target = f"{S3}:{w.fake.port}"
    answer, alpn = h2_through_tunnel(w.proxy.port, target, ("aws-1", KEYS["aws-1"]), w.proxy.ca, [
        (":method", "PUT"), (":scheme", "https"), (":authority", target),
        (":path", "/bkt/h2-empty-frame"), *headers], frames)
    assert (alpn, answer.status) == ("h2", 200), answer
    aws: AwsFake = w.aws  # type: ignore[attr-defined]
    assert "s3 PUT /bkt/h2-empty-frame" in aws.verified
    assert aws.objects["/bkt/h2-empty-frame"] == b"".join(chunks)


@pytest.mark.parametrize("protocol", ["http1", "http2"])
def test_a_chunk_signed_upload_without_a_length_is_re_signed(w: World, protocol: str) -> None:
    """Chunked on the wire over HTTP/1, or HTTP/2 without content-length: the fake is sent the
    body chunked. While the re-signer holds a chunk still coming it passes on nothing, and
    mitmproxy wrote that empty piece as HTTP/1's last chunk: the fake read the body's end there
    (a body with no chunk in it; over HTTP/1 the rest then as a next request, and closed: 502
    upstream_reset)."""
    # Pieces smaller than chunks; over HTTP/2, all within the first flow-control window.
    size, piece = (70000, 16384) if protocol == "http1" else (12000, 4096)
    chunks = [bytes([97 + i]) * size for i in range(4)]
    headers, body = _chunk_signed(chunks)
    headers = [(k, v) for k, v in headers if k != "content-length"]
    pieces = [body[at:at + piece] for at in range(0, len(body), piece)]
    key = f"/bkt/no-length-{protocol}"
    target = f"{S3}:{w.fake.port}"
    if protocol == "http2":
        answer, alpn = h2_through_tunnel(
            w.proxy.port, target, ("aws-1", KEYS["aws-1"]), w.proxy.ca,
            [(":method", "PUT"), (":scheme", "https"), (":authority", target), (":path", key),
             *headers], pieces)
        assert alpn == "h2"
    else:
        sock, tunnel = open_tunnel(w.proxy.port, target, [
            ("Proxy-Authorization", proxy_auth("aws-1", KEYS["aws-1"]))])
        with sock, tls_wrap(sock, S3, w.proxy.ca) as tls:
            assert tunnel.status == 200
            tls.sendall(request_bytes("PUT", key, [("Host", target), *headers,
                                                   ("Transfer-Encoding", "chunked")]))
            tls.sendall(b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n")
            answer = read_response(tls)
    assert answer.status == 200, answer
    aws: AwsFake = w.aws  # type: ignore[attr-defined]
    assert f"s3 PUT {key}" in aws.verified and aws.objects[key] == b"".join(chunks)


@pytest.mark.parametrize(("sealed", "reason"), [(False, "request_inapplicable"),
                                                (True, "token_inapplicable")],
                         ids=["brokered", "sealed"])
def test_a_chunk_signed_upload_broken_halfway_never_completes_upstream(
    w: World, sealed: bool, reason: str
) -> None:
    """Refused as it streams, with the reason the credential's other refusals give."""
    key = f"broken-{'sealed' if sealed else 'brokered'}"
    env = sealed_env(w) if sealed else aws_env(w, "aws-1")
    out = w.run(CLIENT + MANY_CHUNKS, env, s3=w.url(host=S3), key=key, sizes=[65536] * 4,
                broken=True).ok()
    assert out["status"] != 200
    fake: AwsFake = w.aws  # type: ignore[attr-defined]
    assert f"s3 PUT /bkt/{key}" not in fake.verified
    assert not [k for k in fake.objects if "broken" in k]
    line = w.proxy.wait_audit(lambda e: e.get("path") == f"/bkt/{key}" and e.get("reason"))
    assert (line["decision"], line["reason"]) == ("deny", reason)
    # The fake records the upload cut off on its way when its connection ends, which may be
    # after the refusal: waited for here, or it lands in the next test's fresh fake (the
    # trailer test's "nothing reached the fake" failed so, 2 runs in 40).
    deadline = time.monotonic() + 5
    while not w.fake.requests and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_chunk_signed_upload_with_trailer_is_refused(w: World) -> None:
    out = run_refused(w, CHUNKED, "aws_streaming_signed", s3=w.url(host=S3),
                      mode="STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER")
    assert "no trailer" in out["text"]


@pytest.mark.parametrize("broken", [False, True], ids=["whole", "broken"])
def test_a_chunk_signed_upload_without_a_length_is_held_to_the_request_cap(
    w: World, broken: bool
) -> None:
    """Chunked on the wire (no Content-Length to refuse at the head), 12 chunks of 1 MiB past
    the policy's default 10 MiB: refused as it streams through the re-signer, with nothing
    stored and at most the cap at the fake. A body the re-signer refused on the way (its
    second chunk one byte short) is refused for that, not for its size, when it reaches the
    cap: it went on being read to the end before, however long."""
    chunks = [bytes([65 + i]) * (1 << 20) for i in range(12)]
    headers, body = _chunk_signed(chunks)
    if broken:
        body = body.replace(b"\r\n" + chunks[1], b"\r\n" + chunks[1][1:], 1)
    headers = [(k, v) for k, v in headers if k != "content-length"]
    key = f"/bkt/over-cap-{'broken' if broken else 'whole'}"
    target = f"{S3}:{w.fake.port}"
    sock, tunnel = open_tunnel(w.proxy.port, target, [
        ("Proxy-Authorization", proxy_auth("aws-1", KEYS["aws-1"]))])
    with sock, tls_wrap(sock, S3, w.proxy.ca) as tls:
        assert tunnel.status == 200
        tls.sendall(request_bytes("PUT", key, [("Host", target), *headers,
                                               ("Transfer-Encoding", "chunked")]))
        for at in range(0, len(body), 65536):
            piece = body[at:at + 65536]
            tls.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        tls.sendall(b"0\r\n\r\n")
        answer = read_response(tls)
    reason = "request_inapplicable" if broken else "request_too_large"
    assert (answer.status, answer.headers.get("x-sealgate-error")) == (
        400 if broken else 413, reason)
    aws: AwsFake = w.aws  # type: ignore[attr-defined]
    assert f"s3 PUT {key}" not in aws.verified and key not in aws.objects
    assert all(len(r.body) <= 10 << 20 for r in w.fake.requests if r.path == key)
    line = w.proxy.wait_audit(lambda e: e.get("path") == key and e.get("reason"))
    assert (line["decision"], line["reason"]) == ("deny", reason)
