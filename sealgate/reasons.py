"""Every reason code sealgate answers with or logs, as one enum, and the error base that carries it.

A reason is what a sandbox reads in `X-Sealgate-Error` and the JSON body, what the audit log and
metrics count by, and what a rules test case asserts. As free strings a typo became a 403 no one
noticed; as members each code has exactly one spelling, one HTTP status and one description
(docs/rules.md's table is generated from them, and a test keeps it so). A `Reason` is a `str`, so
it is written into JSON and compared with text as the code itself.

    python -m sealgate.reasons    # the Markdown table of docs/rules.md
"""

from __future__ import annotations

import sys
from enum import StrEnum


class Reason(StrEnum):
    status: int
    description: str

    def __new__(cls, code: str, status: int, description: str) -> Reason:
        member = str.__new__(cls, code)
        member._value_ = code
        member.status = status
        member.description = description
        return member

    @classmethod
    def of(cls, code: str) -> Reason:
        """The member for a code; ValueError for one that is not a reason (a bug: the caller's
        hook refuses with internal_error)."""
        try:
            return _BY_CODE[code]
        except KeyError:
            raise ValueError(f"not a reason code: {code[:64]!r}") from None

    # -- the decision ----------------------------------------------------------------------
    NOT_ALLOWED = ("not_allowed", 403, "no rule of the policy allows this host, port, method, path")
    TOKENS_NOT_ALLOWED = (
        "tokens_not_allowed", 403,
        "a sealed token where the policy accepts none",
    )
    INSECURE_UPSTREAM = (
        "insecure_upstream", 403,
        "a credential would travel without verified TLS (and no plain_http rule allows it)",
    )
    PROTOCOL_NOT_ALLOWED = (
        "protocol_not_allowed", 403, "a protocol switch to anything but WebSocket, or an MCP "
        "input request (elicitation, sampling) through the gateway",
    )
    # -- identity --------------------------------------------------------------------------
    IDENTITY_REQUIRED = (
        "identity_required", 407, "no Proxy-Authorization and no default policy",
    )
    IDENTITY_INVALID = ("identity_invalid", 407, "an unknown sandbox or a wrong key")
    TOKEN_BINDING = (
        "token_binding", 407, "a token bound to another sandbox, policy or proxy credential",
    )
    # -- names: malformed (400) ------------------------------------------------------------
    HOST_INVALID_CHAR = ("host_invalid_char", 400, "a character no host name may hold")
    HOST_USERINFO = ("host_userinfo", 400, "user information (`user@`) in the authority")
    HOST_EMPTY = ("host_empty", 400, "no host")
    HOST_EMPTY_LABEL = ("host_empty_label", 400, "an empty label (`a..b`)")
    HOST_TOO_LONG = ("host_too_long", 400, "a name or label over the DNS limits")
    HOST_NUMERIC = ("host_numeric", 400, "a numeric host in a non-canonical form (`0x7f.1`)")
    HOST_IPV6_UNBRACKETED = ("host_ipv6_unbracketed", 400, "an IPv6 address without brackets")
    HOST_IDNA = ("host_idna", 400, "a name UTS-46 cannot map")
    PORT_INVALID = ("port_invalid", 400, "a port that is not 1-65535")
    PATH_INVALID = ("path_invalid", 400, "a path the proxy will not interpret (dot segments, …)")
    SCHEME_INVALID = ("scheme_invalid", 400, "a scheme other than http and https")
    BAD_REQUEST = ("bad_request", 400, "a request the proxy cannot read")
    URI_TOO_LONG = ("uri_too_long", 414, "a request target over the proxy's limit (8 KiB)")
    HEADERS_TOO_LARGE = (
        "headers_too_large", 431, "a request head over the proxy's limits (64 KiB, 100 fields)",
    )
    REQUEST_TIMEOUT = (
        "request_timeout", 408, "a request head not complete within the header timeout (10 s)",
    )
    # -- names: never reachable (403) ------------------------------------------------------
    LOCALHOST_NAME = ("localhost_name", 403, "localhost and names under it")
    METADATA_NAME = ("metadata_name", 403, "a cloud metadata name (`metadata.google.internal`)")
    INTERNAL_NAME = ("internal_name", 403, "a name under an internal-only suffix (`.internal`)")
    SINGLE_LABEL = ("single_label", 403, "a single-label name, resolved by search paths")
    NAME_MISMATCH = (
        "name_mismatch", 403,
        "the names of one connection disagree (CONNECT, Host, URI, upstream)",
    )
    SNI_MISMATCH = ("sni_mismatch", 403, "the TLS SNI names another host than the CONNECT")
    PROXY_LOOP = ("proxy_loop", 403, "the proxy's own listen address")
    # -- addresses (403) -------------------------------------------------------------------
    METADATA = ("metadata", 403, "a cloud metadata address; never opened by allow_networks")
    HOST_ADDRESS = (
        "host_address", 403,
        "an address of the proxy's host (any interface); never opened by allow_networks",
    )
    SANDBOX_NETWORK = (
        "sandbox_network", 403, "an address of the sandbox range; never opened by allow_networks",
    )
    THIS_NETWORK = ("this_network", 403, "0.0.0.0/8, which reaches the host itself")
    PRIVATE = ("private", 403, "RFC 1918 private range")
    CGNAT = ("cgnat", 403, "100.64.0.0/10, carrier-grade NAT")
    LOOPBACK = ("loopback", 403, "loopback")
    LINK_LOCAL = ("link_local", 403, "link-local")
    IETF_PROTOCOL = ("ietf_protocol", 403, "IETF protocol assignments (192.0.0.0/24, 2001::/23)")
    DOCUMENTATION = ("documentation", 403, "documentation ranges")
    AS112 = ("as112", 403, "AS112 DNS sinks")
    AMT = ("amt", 403, "automatic multicast tunnelling")
    SIX_TO_FOUR_RELAY = ("6to4_relay", 403, "the 6to4 relay anycast range")
    SIX_TO_FOUR = ("6to4", 403, "6to4, whose embedded IPv4 is denied")
    BENCHMARKING = ("benchmarking", 403, "benchmarking range (198.18.0.0/15)")
    MULTICAST = ("multicast", 403, "multicast")
    RESERVED = ("reserved", 403, "reserved (240.0.0.0/4)")
    BROADCAST = ("broadcast", 403, "limited broadcast")
    IPV6_NOT_GLOBAL_UNICAST = ("ipv6_not_global_unicast", 403, "IPv6 outside 2000::/3")
    UNSPECIFIED = ("unspecified", 403, "the unspecified address, which reaches the host")
    IPV4_COMPATIBLE = ("ipv4_compatible", 403, "deprecated IPv4-compatible IPv6")
    IPV4_MAPPED = ("ipv4_mapped", 403, "IPv4-mapped IPv6 whose IPv4 is denied")
    IPV4_TRANSLATED = ("ipv4_translated", 403, "IPv4-translated IPv6")
    NAT64 = ("nat64", 403, "NAT64 whose embedded IPv4 is denied")
    DISCARD = ("discard", 403, "the IPv6 discard prefix")
    SRV6_SID = ("srv6_sid", 403, "SRv6 SIDs")
    UNIQUE_LOCAL = ("unique_local", 403, "IPv6 unique local (fc00::/7)")
    SITE_LOCAL = ("site_local", 403, "deprecated IPv6 site-local")
    # -- sealed tokens and injection -------------------------------------------------------
    TOKEN_MALFORMED = ("token_malformed", 400, "a token that does not parse")
    TOKEN_INVALID = ("token_invalid", 400, "a token this proxy cannot open or that fails checks")
    TOKEN_EXPIRED = ("token_expired", 401, "a token outside its time window")
    TOKEN_SCOPE = ("token_scope", 403, "a token used for a host, method or path it does not name")
    TOKEN_INAPPLICABLE = ("token_inapplicable", 400, "the request lacks what the token writes into")
    REQUEST_INAPPLICABLE = (
        "request_inapplicable", 400, "the request lacks what a rule's credential writes into",
    )
    INJECTION_CONFLICT = ("injection_conflict", 400, "two credentials write the same place")
    SECRET_INVALID = ("secret_invalid", 400, "a secret its processor cannot carry")
    PROCESSOR_INVALID = ("processor_invalid", 400, "processor settings that break its rules")
    LENGTH_REQUIRED = ("length_required", 411, "a body signature over a chunked body")
    AWS_SCOPE = (
        "aws_scope", 403,
        "a SigV4 request for a service or region its aws-sigv4 credential does not allow",
    )
    AWS_CLOCK_SKEW = (
        "aws_clock_skew", 400,
        "a SigV4 request dated over 5 minutes from the proxy's clock, or a presigned URL expired",
    )
    AWS_STREAMING_SIGNED = (
        "aws_streaming_signed", 400,
        "a SigV4 upload signed chunk by chunk with a trailer or ECDSA, which the proxy does not "
        "re-sign",
    )
    CREDENTIALS_TOO_LARGE = (
        "credentials_too_large", 400,
        "a request's credentials (sealed tokens and brokered secrets together) over the "
        "scrubber's limits: too many or too long forms to look for in the response",
    )
    # -- budgets ---------------------------------------------------------------------------
    REQUEST_TOO_LARGE = ("request_too_large", 413, "a body over the policy's per-request bytes")
    BUDGET_EXCEEDED = ("budget_exceeded", 429, "a rate, connection or byte budget is spent")
    SOURCE_AT_CAPACITY = (
        "source_at_capacity", 429,
        "one source address holds its most connections (--max-connections-per-source): the "
        "next is closed as it is accepted",
    )
    PROXY_AT_CAPACITY = (
        "proxy_at_capacity", 503,
        "the worker holds its most connections (--max-connections): the next is closed as it "
        "is accepted",
    )
    # -- failures before forwarding (5xx): nothing was sent ---------------------------------
    DNS_NXDOMAIN = ("dns_nxdomain", 502, "the name does not exist")
    DNS_NO_ANSWER = ("dns_no_answer", 502, "the name has no address")
    DNS_ERROR = ("dns_error", 502, "the name server failed")
    DNS_TIMEOUT = ("dns_timeout", 504, "the name server did not answer in time")
    CONNECT_FAILED = ("connect_failed", 502, "the upstream could not be connected to")
    UPSTREAM_TLS_FAILED = (
        "upstream_tls_failed", 502,
        "the upstream's TLS handshake failed (a certificate untrusted, expired or for another "
        "name, or no TLS at all)",
    )
    UPSTREAM_RESET = (
        "upstream_reset", 502, "the upstream closed or reset the connection before a response",
    )
    CONNECT_TIMEOUT = (
        "connect_timeout", 504, "the upstream did not accept, or finish our TLS handshake, in time",
    )
    UPSTREAM_TIMEOUT = (
        "upstream_timeout", 504,
        "the upstream sent no response head in time (--response-timeout, a rule's "
        "response_timeout); the request had been forwarded",
    )
    INTERNAL_ERROR = ("internal_error", 500, "a bug: the proxy could not decide, so it refused")
    AUDIT_UNAVAILABLE = ("audit_unavailable", 503, "the audit log cannot be written")
    SECRET_UNAVAILABLE = (
        "secret_unavailable", 503, "the secret store cannot produce the secret (past its grace)",
    )
    RULES_UNAVAILABLE = ("rules_unavailable", 503, "no rules are loaded")
    # -- tool calls over MCP (`sealgate mcp serve`, docs/mcp.md): an error result ----------
    TOOL_ARGUMENTS_INVALID = (
        "tool_arguments_invalid", 400, "a tool's arguments fail its schema or its templates",
    )
    TOOL_CREDENTIAL = (
        "tool_credential", 403,
        "the rule that allows a tool's call does not inject the credential the tool names",
    )
    RESPONSE_TOO_LARGE = (
        "response_too_large", 502, "an answer over the tool's max_response_bytes",
    )
    RESPONSE_NOT_JSON = (
        "response_not_json", 502, "an answer a tool's `returns` fields cannot be read from",
    )
    # -- responses refused (the connection closed, or response_sliced answered; audited) -------
    ENCODING_UNSCRUBBABLE = (
        "encoding_unscrubbable", 502, "a response coding that cannot be scrubbed (br, stacked)",
    )
    DECODE_FAILED = ("decode_failed", 502, "a compressed response that does not decode")
    DECODED_TOO_LARGE = (
        "decoded_too_large", 502, "a response chunk decoding past the bomb limit",
    )
    RESPONSE_SLICED = (
        "response_sliced", 502, "a partial answer (206, Content-Range) to a request a credential "
        "was injected into: answered with this refusal instead (the scrubber finds whole secrets)",
    )
    # -- secret stores, keys, rules (configuration) ----------------------------------------
    SECRET_ERROR = ("secret_error", 503, "a secret store failure (the base of the secret codes)")
    SECRET_NOT_FOUND = ("secret_not_found", 503, "the store has no such secret")
    SECRET_DENIED = ("secret_denied", 503, "the store refuses the proxy's credentials")
    SECRET_CONFIG = ("secret_config", 500, "a secret store's configuration is unusable")
    KEY_FILE_PERMISSIONS = ("key_file_permissions", 500, "a private key file others can read")
    KEY_FILE_INVALID = ("key_file_invalid", 500, "a key file or key directory that cannot be used")
    NO_KEYS = ("no_keys", 500, "a key directory without keys")
    RULES_INVALID = ("rules_invalid", 500, "a rules file that does not load")
    PATH_PATTERN_INVALID = ("path_pattern_invalid", 500, "a rule's path pattern that cannot match")
    CALLERS_FILE_INVALID = ("callers_file_invalid", 500, "a callers file that does not load")
    # -- the issuer service ----------------------------------------------------------------
    MINT_REFUSED = ("mint_refused", 400, "a mint request refused (the base of the issuer's codes)")
    UNAUTHENTICATED = ("unauthenticated", 401, "no or a wrong caller key")
    RATE_LIMITED = ("rate_limited", 429, "the caller's minting rate is spent")
    BODY_TOO_LARGE = ("body_too_large", 413, "a mint request over the size limit")
    BAD_JSON = ("bad_json", 400, "a mint or registration body that is not a JSON object")
    UNKNOWN_FIELD = ("unknown_field", 400, "a field the mint request does not have")
    MISSING_FIELD = ("missing_field", 400, "a required field missing")
    INVALID_REQUEST = ("invalid_request", 400, "a mint request whose values break its rules")
    NOT_PERMITTED = (
        "not_permitted", 403, "a mint outside the caller's entry (the base of the five below)",
    )
    HOST_NOT_PERMITTED = ("host_not_permitted", 403, "a host the caller may not mint for")
    PROCESSOR_NOT_PERMITTED = (
        "processor_not_permitted", 403, "a processor the caller may not mint",
    )
    TTL_TOO_LONG = ("ttl_too_long", 403, "a lifetime over the caller's maximum")
    BINDING_REQUIRED = ("binding_required", 403, "the caller must bind its tokens")
    BINDING_NOT_PERMITTED = ("binding_not_permitted", 403, "a binding the caller may not give")
    # -- the control API (sandbox registration, a local socket) ----------------------------
    UNKNOWN_SANDBOX = ("unknown_sandbox", 404, "a sandbox the rules do not name")
    BAD_ADDRESS = ("bad_address", 400, "a source address that is not an IP address")
    REGISTRY_UNAVAILABLE = ("registry_unavailable", 503, "the source registry cannot be written")
    NOT_REGISTERED = ("not_registered", 404, "no sandbox is registered for that address")
    # -- the sandbox runtime (exits with a message; never an HTTP answer) ------------------
    SANDBOX_FAILED = (
        "sandbox_failed", 500,
        "a sandbox could not be set up or started (network, firewall, cgroup, seccomp)",
    )
    # -- the sandbox daemon's API (`sealgate sandboxd`) ------------------------------------
    UNAUTHORIZED = ("unauthorized", 401, "no or a wrong bearer key on the daemon's TCP listener")
    NO_SUCH_SANDBOX = ("no_such_sandbox", 404, "no live sandbox has that id")
    SANDBOX_ENDED = ("sandbox_ended", 410, "the sandbox ended: deleted, expired, its agent died")
    SANDBOX_BUSY = ("sandbox_busy", 429, "a sandbox already running its most requests at once")
    SANDBOX_PAUSED = ("sandbox_paused", 409, "the sandbox is paused: resume it first")
    PORT_UNREACHABLE = (
        "port_unreachable", 502, "nothing in the sandbox answers HTTP on that port",
    )
    BAD_SIGNATURE = (
        "bad_signature", 403,
        "a signed port URL that is tampered with, expired, or for another sandbox or port",
    )
    NO_SUCH_PROCESS = ("no_such_process", 404, "no background process of that sandbox has that id")
    NO_SUCH_IMAGE = ("no_such_image", 404, "no image, template or snapshot of that name")
    IMAGE_REFUSED = (
        "image_refused", 403, "an image another policy's sandbox made (a snapshot, a template)",
    )
    UNSUPPORTED = ("unsupported", 501, "a call the daemon's isolation tier cannot serve")
    AT_CAPACITY = ("at_capacity", 503, "the daemon holds its most sandboxes, or is not ready")
    BAD_PATH = ("bad_path", 400, "a file path outside the workspace: absolute, '..', a link")
    NO_SUCH_FILE = ("no_such_file", 404, "no regular file at that path of the workspace")
    TOO_LARGE = ("too_large", 413, "a body, file, stdin or field over its cap")
    FILE_EXISTS = (
        "file_exists", 409, "a workspace path already taken (mkdir, a rename onto a non-empty "
        "directory)",
    )
    BAD_ARCHIVE = (
        "bad_archive", 400, "a tar stream refused whole: a member leaving its directory or "
        "going through a link, a device or FIFO, a hard link out, over a cap, not a tar",
    )
    CLIENT_TIMEOUT = (
        "client_timeout", 504,
        "the daemon's client gave up: the call's own time limit (`call_timeout`) passed before "
        "its answer ended (raised by the client, never answered by the daemon)",
    )


_BY_CODE: dict[str, Reason] = {member.value: member for member in Reason}


class SealgateError(Exception):
    """The base of every error sealgate raises on purpose. It carries a `Reason`, so whoever
    catches it can answer, log and count it without knowing the class: a subclass names its
    reason as a class attribute, or an instance is given one."""

    reason: Reason = Reason.INTERNAL_ERROR

    def __init__(self, message: str = "", *, reason: Reason | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


def markdown() -> str:
    """The reasons table of docs/rules.md."""
    lines = ["| reason | status | when |", "|---|---|---|"]
    lines += [f"| `{r.value}` | {r.status} | {r.description} |" for r in Reason]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
