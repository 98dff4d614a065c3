// sealgate client helpers for JavaScript: ESM, no dependencies, Node 20+ (also Deno, Bun).
//
//   import { baseUrl, sealgateFetch } from "./sealgate.mjs";
//   const fetch = sealgateFetch("http://10.0.0.5:8080", { tokens: [token] });
//   await fetch("https://api.openai.com/v1/models");        // goes to the proxy as
//                                                             // http://10.0.0.5:8080/_/api.openai.com/v1/models
//   new OpenAI({ baseURL: baseUrl("http://10.0.0.5:8080", "https://api.openai.com/v1") });
//
// Node 20's fetch ignores HTTPS_PROXY (Node 24 reads it with NODE_USE_ENV_PROXY=1), so these
// use base-URL mode: `https://<host>[:<port>]/<path>` is sent as plain HTTP to
// `http://<proxy>/_/[<token>,...@]<host>[:<port>]/<path>`, and the proxy speaks verified TLS to
// the upstream. No CA is needed on this side. The rules are those of sealgate/clients/_routing.py
// (docs/clients.md); the two are tested against the same cases.

export const MAX_TOKENS = 8;
export const MAX_TOKEN_LENGTH = 8192;
export const TOKENIZER_HEADER = "Proxy-Tokenizer";
export const ERROR_HEADER = "X-Sealgate-Error";
const PREFIX = "/_/";
const MAX_REDIRECTS = 20;

const TOKEN = /^sg1\.[0-9a-f]{16}\.[A-Za-z0-9_-]+$/;
const SANDBOX_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
const KEY = /^[\x21-\x2b\x2d-\x7e]{1,4096}$/; // visible ASCII but ","
const VISIBLE = /^[\x21-\x7e]*$/;
const LABEL = /^[a-z0-9_-]{1,63}$/;
const NUMERIC_LABEL = /^(?:[0-9]+|0x[0-9a-f]*)$/;
const OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
const DOTTED_QUAD = new RegExp(`^(?:${OCTET}\\.){3}${OCTET}$`);
const PORT = /^[1-9][0-9]{0,4}$/;

/** A proxy URL, credential, token or URL these helpers will not send. */
export class SealgateConfigError extends TypeError {
  constructor(message) {
    super(`sealgate: ${message}`);
    this.name = "SealgateConfigError";
  }
}

/** The tokens as an array, each checked to be one `sg1.<16 hex>.<base64url>` token (a string
 * is one token); duplicates dropped, at most MAX_TOKENS. */
export function checkTokens(tokens = []) {
  const items = typeof tokens === "string" ? [tokens] : Array.from(tokens);
  const seen = [];
  items.forEach((token, index) => {
    const problem = tokenProblem(token);
    if (problem) throw new SealgateConfigError(`token ${index + 1} ${problem}`);
    if (!seen.includes(token)) seen.push(token);
  });
  if (seen.length > MAX_TOKENS) {
    throw new SealgateConfigError(`${seen.length} tokens: the proxy takes at most ${MAX_TOKENS}`);
  }
  return seen;
}

function tokenProblem(token) {
  if (typeof token !== "string") return `is a ${typeof token}, not a string`;
  if (!token) return "is empty";
  if (token.length > MAX_TOKEN_LENGTH) {
    return `is ${token.length} characters long (at most ${MAX_TOKEN_LENGTH})`;
  }
  if (token.includes(",")) return "has a ',': pass each token on its own, not a comma-separated list";
  if (/[\r\n]/.test(token)) return "has a CR or LF";
  if (/\s/.test(token)) return "has whitespace";
  if (!TOKEN.test(token)) return "is not a sealed token (sg1.<16 hex digits>.<base64url>)";
  return null;
}

function checkCredentials(sandbox, key) {
  if ((sandbox == null) !== (key == null)) {
    throw new SealgateConfigError("sandbox and key go together: the key proves the sandbox");
  }
  if (sandbox != null && !(typeof sandbox === "string" && SANDBOX_ID.test(sandbox))) {
    throw new SealgateConfigError(
      "the sandbox id is not 1-64 of A-Z a-z 0-9 . _ - starting with a letter or digit");
  }
  if (key != null && !(typeof key === "string" && KEY.test(key))) {
    throw new SealgateConfigError(
      "the sandbox key must be 1-4096 visible ASCII characters without ',' (not shown here)");
  }
}

// -- hosts, as sealgate.hostname.split_authority reads them ------------------------------------

function splitAuthority(authority, defaultPort) {
  if (authority.includes("@")) {
    throw new SealgateConfigError(
      "the URL has user information ('user@host'): credentials go in headers or tokens, " +
      "never in the URL sent to the proxy");
  }
  let hostText;
  let portText = null;
  if (authority.startsWith("[")) {
    const close = authority.indexOf("]");
    if (close < 0) throw new SealgateConfigError("an IPv6 literal has no closing ']'");
    hostText = authority.slice(0, close + 1);
    const rest = authority.slice(close + 1);
    if (rest.startsWith(":")) portText = rest.slice(1);
    else if (rest) throw new SealgateConfigError("unexpected text after ']' in the authority");
  } else {
    const parts = authority.split(":");
    if (parts.length > 2) {
      throw new SealgateConfigError("the authority has several ':'; IPv6 literals need brackets");
    }
    hostText = parts[0];
    if (parts.length === 2) portText = parts[1];
  }
  const host = canonicalHost(hostText);
  let port = defaultPort;
  if (portText !== null) {
    if (!PORT.test(portText) || Number(portText) > 65535) {
      throw new SealgateConfigError(
        `the port for ${host} must be 1-65535, decimal digits without sign or leading zeros`);
    }
    port = Number(portText);
  } else if (port == null) {
    throw new SealgateConfigError(`no port for ${host}`);
  }
  return { host, port };
}

function canonicalHost(raw) {
  if (!raw) throw new SealgateConfigError("the host is empty");
  if (raw.startsWith("[")) {
    const inner = raw.slice(1, -1);
    if (!raw.endsWith("]") || !/^[0-9A-Fa-f:.]+$/.test(inner)) {
      throw new SealgateConfigError("not a valid bracketed IPv6 literal (zone ids are refused)");
    }
    try {
      return new URL(`http://[${inner}]/`).hostname; // "[2001:db8::1]", compressed, lower case
    } catch {
      throw new SealgateConfigError("not a valid bracketed IPv6 literal");
    }
  }
  let text = raw.toLowerCase();
  if (text.endsWith(".")) text = text.slice(0, -1);
  const labels = text.split(".");
  const bad = labels.find((label) => !LABEL.test(label));
  if (bad !== undefined) {
    throw new SealgateConfigError(
      bad ? "the host has a character no host name may hold (IDNs go in xn-- form)"
          : "the host has an empty label");
  }
  if (text.length > 253) throw new SealgateConfigError("the host is longer than 253 octets");
  if (NUMERIC_LABEL.test(labels[labels.length - 1]) && !DOTTED_QUAD.test(text)) {
    throw new SealgateConfigError("a numeric host that is not a canonical dotted quad");
  }
  return text;
}

function authorityText(host, port, defaultPort) {
  return port === defaultPort ? host : `${host}:${port}`;
}

function splitUrl(url) {
  const sep = url.indexOf("://");
  if (sep < 0) return null;
  const rest = url.slice(sep + 3);
  const ends = ["/", "?", "#"].map((c) => rest.indexOf(c)).filter((i) => i >= 0);
  const end = ends.length ? Math.min(...ends) : rest.length;
  return { scheme: url.slice(0, sep).toLowerCase(), authority: rest.slice(0, end),
           tail: rest.slice(end) };
}

// encodeURIComponent as Python's quote(safe=""): also !'()* encoded, so both write one URL.
function quote(text) {
  return encodeURIComponent(text).replace(
    /[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
}

// -- the proxy ---------------------------------------------------------------------------------

/** The proxy's address, and the credentials its URL carries (`http://id:key@host:port`, or
 * `http://_:<token>,...@host:port`). A port is required. */
export function parseProxy(proxy) {
  if (typeof proxy !== "string" || !VISIBLE.test(proxy)) {
    throw new SealgateConfigError(
      "the proxy URL must be a string without whitespace, controls or non-ASCII characters");
  }
  const parts = splitUrl(proxy.includes("://") ? proxy : `http://${proxy}`);
  if (parts.scheme !== "http") {
    throw new SealgateConfigError(
      "sealgate's listener speaks plain http:// (the TLS is to the upstream, through it)");
  }
  if (parts.tail !== "" && parts.tail !== "/") {
    throw new SealgateConfigError("the proxy URL is http://[user:password@]host:port, no path");
  }
  const at = parts.authority.lastIndexOf("@");
  const { host, port } = splitAuthority(parts.authority.slice(at + 1), null);
  const address = { host, port, authority: `${host}:${port}`, origin: `http://${host}:${port}` };
  if (at < 0) return { address, sandbox: undefined, key: undefined, tokens: [] };
  const userinfo = parts.authority.slice(0, at);
  const colon = userinfo.indexOf(":");
  const decode = (text) => {
    try {
      return decodeURIComponent(text);
    } catch {
      throw new SealgateConfigError("the proxy URL's credentials are not valid percent-encoding");
    }
  };
  const user = decode(colon < 0 ? userinfo : userinfo.slice(0, colon));
  const passwordText = colon < 0 ? "" : userinfo.slice(colon + 1);
  const elements = passwordText ? passwordText.split(",").map(decode) : [];
  if (user && user !== NO_ONE) {
    if (!elements.length) throw new SealgateConfigError("the proxy URL names a sandbox without its key");
    checkCredentials(user, elements[0]);
    return { address, sandbox: user, key: elements[0], tokens: checkTokens(elements.slice(1)) };
  }
  return { address, sandbox: undefined, key: undefined, tokens: checkTokens(elements) };
}

// The user that claims no sandbox (no sandbox id starts with "_"): clients drop an empty user.
const NO_ONE = "_";

/** `Proxy-Authorization` for a sandbox and its key, and connection-scoped tokens; null when
 * there is nothing to send. */
export function proxyAuthorization({ sandbox, key, tokens = [] } = {}) {
  checkCredentials(sandbox, key);
  const checked = checkTokens(tokens);
  let pair;
  if (sandbox != null) pair = `${sandbox}:${[key, ...checked].join(",")}`;
  else if (checked.length) pair = `${NO_ONE}:${checked.join(",")}`;
  else return null;
  return `Basic ${btoa(pair)}`; // every part was checked to be ASCII
}

/** The proxy URL with its credentials in it, as HTTPS_PROXY takes it. */
export function proxyUrl(proxy, { sandbox, key, tokens = [] } = {}) {
  const parsed = parseProxy(proxy);
  checkCredentials(sandbox, key);
  if (parsed.sandbox != null && sandbox != null) {
    throw new SealgateConfigError("the proxy URL already names a sandbox");
  }
  const who = parsed.sandbox != null ? parsed : { sandbox, key };
  const all = checkTokens([...parsed.tokens, ...checkTokens(tokens)]);
  const address = parsed.address;
  if (who.sandbox != null) {
    const password = [quote(who.key), ...all].join(",");
    return `http://${quote(who.sandbox)}:${password}@${address.authority}`;
  }
  return all.length ? `http://${NO_ONE}:${all.join(",")}@${address.authority}` : address.origin;
}

// -- base-URL mode -----------------------------------------------------------------------------

function route(address, url, tokens) {
  if (!VISIBLE.test(url)) {
    throw new SealgateConfigError(
      "the URL has whitespace, a control or a non-ASCII character: percent-encode it");
  }
  const parts = splitUrl(url);
  if (!parts || parts.scheme !== "https") {
    throw new SealgateConfigError(
      "base-URL mode forwards https:// URLs only: the proxy speaks verified TLS to the upstream");
  }
  const { host, port } = splitAuthority(parts.authority, 443);
  let tail = parts.tail.split("#")[0];
  if (tail.startsWith("?")) tail = `/${tail}`;
  const target = authorityText(host, port, 443);
  const segment = tokens.length ? `${tokens.join(",")}@${target}` : target;
  return `${address.origin}${PREFIX}${segment}${tail}`;
}

/** `url` (https) in base-URL form on the proxy: `baseUrl("http://10.0.0.5:8080",
 * "https://api.stripe.com")` is `"http://10.0.0.5:8080/_/api.stripe.com"`; with tokens,
 * `.../_/<token>,...@api.stripe.com`. The path and query are kept as written (an empty path
 * stays empty, so an SDK can append its own). Credentials in the proxy URL are not carried:
 * a base URL has no place for the key. */
export function baseUrl(proxy, url, { tokens = [] } = {}) {
  const { address } = parseProxy(proxy);
  const text = url instanceof URL ? url.href : url;
  if (typeof text !== "string") throw new SealgateConfigError("the URL must be a string or a URL");
  return route(address, text, checkTokens(tokens));
}

function atProxy(address, href) {
  const parts = splitUrl(href);
  if (!parts || parts.scheme !== "http") return false;
  try {
    const { host, port } = splitAuthority(parts.authority, 80);
    return host === address.host && port === address.port;
  } catch {
    return false;
  }
}

// The upstream a URL reaches, for telling a cross-origin redirect: for one addressed to the
// proxy, the host its /_/ prefix names.
function upstreamOrigin(address, href) {
  if (!atProxy(address, href)) return new URL(href).origin;
  const { tail } = splitUrl(href);
  if (!tail.startsWith(PREFIX)) return address.origin;
  const rest = tail.slice(PREFIX.length);
  const segment = rest.split(/[/?#]/, 1)[0];
  return `https://${segment.slice(segment.lastIndexOf("@") + 1).toLowerCase()}`;
}

/** A fetch-compatible function that sends every https request to the proxy in base-URL form,
 * with `Proxy-Authorization` (sandbox and key) and `Proxy-Tokenizer` (tokens) added. A request
 * already addressed to the proxy goes as it is; plain http elsewhere is refused (it would
 * bypass the proxy). Redirects are followed here, each hop through the proxy again.
 * `options.fetch` is the fetch underneath (default: globalThis.fetch). */
export function sealgateFetch(proxy, { tokens = [], sandbox, key, fetch: inner } = {}) {
  const { address } = parseProxy(proxy);
  checkCredentials(sandbox, key);
  const checked = checkTokens(tokens);
  const added = {};
  if (sandbox != null) added["Proxy-Authorization"] = proxyAuthorization({ sandbox, key });
  if (checked.length) added[TOKENIZER_HEADER] = checked.join(",");
  const send = inner ?? globalThis.fetch;
  if (typeof send !== "function") throw new SealgateConfigError("no fetch to send with");

  function prepare(href, headers) {
    // WHATWG's serialisation first: what fetch itself would send (IDNA, percent-encoding).
    const normalised = new URL(href).href;
    const target = atProxy(address, normalised) ? normalised : route(address, normalised, []);
    for (const [name, value] of Object.entries(added)) headers.set(name, value);
    return target;
  }

  return async function fetchThroughSealgate(input, init = undefined) {
    const request = new Request(input, init);
    const mode = request.redirect;
    const headers = new Headers(request.headers);
    let method = request.method;
    let body = request.body === null ? null : await request.arrayBuffer();
    let href = request.url;
    for (let hop = 0; ; hop++) {
      const target = prepare(href, headers);
      const response = await send(target, {
        method, headers, body, redirect: "manual", signal: request.signal,
      });
      const location = response.headers.get("location");
      if (mode === "manual" || ![301, 302, 303, 307, 308].includes(response.status) || !location) {
        return response;
      }
      if (mode === "error") throw new TypeError(`sealgate: redirect to ${location} refused`);
      if (hop >= MAX_REDIRECTS) throw new TypeError("sealgate: too many redirects");
      await response.body?.cancel();
      // Relative to what was fetched: the proxy points redirects back through itself.
      const from = upstreamOrigin(address, target);
      href = new URL(location, target).href;
      if (!href.startsWith("https:") && !atProxy(address, href)) {
        throw new TypeError("sealgate: a redirect to plain http would bypass the proxy");
      }
      if (upstreamOrigin(address, href) !== from) {
        headers.delete("authorization"); // as fetch does on a cross-origin redirect
        headers.delete("cookie");
      }
      if (response.status === 303 || ((response.status === 301 || response.status === 302)
                                       && method === "POST")) {
        method = method === "HEAD" ? "HEAD" : "GET";
        body = null;
        for (const name of ["content-type", "content-length", "content-encoding"]) {
          headers.delete(name);
        }
      }
    }
  };
}

/** The proxy's refusal in a response (the JSON body and X-Sealgate-Error), or null. Reads the
 * body of a clone, so the response stays readable. */
export async function refusal(response) {
  const reason = response.headers.get(ERROR_HEADER);
  if (!reason) return null;
  let body = {};
  try {
    const parsed = await response.clone().json();
    if (parsed && typeof parsed === "object") body = parsed;
  } catch {
    // not JSON: the header still says why
  }
  const error = typeof body.error === "object" && body.error ? body.error : {};
  return {
    status: response.status,
    reason: typeof body.reason === "string" ? body.reason : reason,
    type: typeof error.type === "string" ? error.type : "",
    message: typeof error.message === "string" ? error.message : "",
    detail: typeof body.detail === "string" ? body.detail : "",
    host: body.host ?? null,
    policy: body.policy ?? null,
    requestId: body.request_id ?? error.request_id ?? null,
  };
}
