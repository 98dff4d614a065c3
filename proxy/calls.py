"""The proxy's face for sealgate's own services that make calls for a sandbox (the MCP server,
`sealgate.mcp`): the same decision, guard, credentials, scrubbing and budgets a proxied request
gets, without the proxy's process around them.

Nothing here imports mitmproxy (tests/process/test_proxy_face.py checks it, and the MCP server's
own virtualenv has none): rules are loaded, a sandbox identified, a call decided (`decide`),
its address pinned by the guard (`Guard.pin`), its credentials worked out by the broker
(`Broker.credentials`) and written by their processors, its answer scrubbed (`Scrubber`) and
its budget taken (`BudgetLedger`) by the very code the proxy's request path calls.
"""

from .credentials.awsroles import RoleSessions
from .credentials.broker import Broker
from .credentials.dial import Pinned
from .credentials.inject import Credential, Injected
from .credentials.scrub import REDACTED, Scrubber
from .credentials.secrets import SecretBroker, SecretError, open_store
from .errors import Denial, ProxyError
from .net.guard import DEFAULT_SANDBOX_NETWORKS, Guard, Pin
from .net.resolver import Resolver
from .policy.decide import Decision, Identity, Question, decide, policy_for
from .policy.httptool import HttpRequestTool
from .policy.model import Injection, PathError, Policy, Rule, RuleSet, normalize_path
from .policy.reshaping import is_slice, sliced
from .policy.rulesfile import RulesError, load_rules
from .policy.tools import Tool, ToolArgumentError, ToolRequest, select
from .request.budget import BudgetLedger, hold
from .request.identity import Identifier
from .request.registry import SourceRegistry

__all__ = [
    "DEFAULT_SANDBOX_NETWORKS",
    "REDACTED",
    "Broker",
    "BudgetLedger",
    "Credential",
    "Decision",
    "Denial",
    "Guard",
    "HttpRequestTool",
    "Identifier",
    "Identity",
    "Injected",
    "Injection",
    "PathError",
    "Pin",
    "Pinned",
    "Policy",
    "ProxyError",
    "Question",
    "Resolver",
    "RoleSessions",
    "Rule",
    "RuleSet",
    "RulesError",
    "Scrubber",
    "SecretBroker",
    "SecretError",
    "SourceRegistry",
    "Tool",
    "ToolArgumentError",
    "ToolRequest",
    "decide",
    "hold",
    "is_slice",
    "load_rules",
    "normalize_path",
    "open_store",
    "policy_for",
    "select",
    "sliced",
]
