-- wrk script for bench/proxy_overhead.py: one fixed request, one JSON summary line at the end.
--
-- Environment:
--   REQUEST_TARGET  what goes on the request line. Through a forward proxy this is the
--                   absolute form (http://origin.bench:8080/1k), exactly what an http_proxy
--                   client sends; direct to the origin it is just the path (/1k).
--   HOST_HEADER     Host header; defaults to the host wrk connects to.
--   PROXY_AUTH      optional base64 of "id:key", sent as Proxy-Authorization: Basic on every
--                   request, as curl and Python's requests do with http://id:key@proxy.

local request_line_target = os.getenv("REQUEST_TARGET") or "/"
local host_header = os.getenv("HOST_HEADER")
local proxy_auth = os.getenv("PROXY_AUTH")
local req

function init(args)
  local headers = {}
  if host_header ~= nil and host_header ~= "" then
    headers["Host"] = host_header
  end
  if proxy_auth ~= nil and proxy_auth ~= "" then
    headers["Proxy-Authorization"] = "Basic " .. proxy_auth
  end
  req = wrk.format("GET", request_line_target, headers)
end

function request()
  return req
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\nWRK_JSON {"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, '
      .. '"connect_errors": %d, "read_errors": %d, "write_errors": %d, '
      .. '"status_errors": %d, "timeouts": %d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect, e.read, e.write, e.status, e.timeout))
end
