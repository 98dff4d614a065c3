# Two commands matter: `make run` and `make test`. Everything else is set-up they call.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.sealgate-installed
# Debian packages the runtime and the tests use: iproute2/nftables/iptables for sandbox
# networks and transparent mode, bubblewrap (and util-linux's setpriv) for sandboxes;
# squid/wrk only for the benchmark (see `make bench`).
DEB_RUNTIME := iproute2 nftables iptables ca-certificates curl bubblewrap util-linux runsc
DEB_BENCH := squid wrk nginx-light hey
# The microVM tier's QEMU; its guest kernel and busybox are unpacked from Debian's packages into
# var/microvm by scripts/microvm-image, never installed on the host. erofs-utils makes an image's
# disk for a microVM sandbox (sandbox/images/disk.py).
DEB_MICROVM := qemu-system-x86 erofs-utils
# The OCI images the sandbox tests start from (scripts/test-images): debian's is debootstrapped;
# busybox's package is unpacked by apt-get download and dpkg-deb, never installed on the host.
# skopeo pulls images; docker-registry is a real registry on loopback for the pull's test (apt
# never starts it as a service: scripts/debian-deps.sh). podman (with runc) builds and runs
# sealgate's own container images (`make images`).
DEB_IMAGES := debootstrap skopeo docker-registry podman runc

.PHONY: run test lint unit deps bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $@

# The MCP server's own virtualenv (docs/mcp.md): the `mcp` SDK needs an h11 that mitmproxy, in
# $(VENV), does not allow, so `sealgate mcp serve` execs this one's python. The SDK pinned and
# what sealgate's modules below the MCP server need (mcp/requirements.txt), then sealgate
# itself, editable and without its dependencies (no mitmproxy). Remade only when either file
# changed; the tests run its python for the official MCP client.
MCP_VENV := var/mcp-venv
MCP_STAMP := $(MCP_VENV)/.sealgate-installed
$(MCP_STAMP): mcp/requirements.txt pyproject.toml
	@test -x $(MCP_VENV)/bin/python || $(PYTHON) -m venv $(MCP_VENV)
	$(MCP_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r mcp/requirements.txt
	$(MCP_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
		--no-build-isolation -e .
	@touch $@

# Installs missing Debian packages when root; otherwise says what is missing and goes on
# (tests that need them skip with that reason). And the MCP virtualenv.
deps: $(MCP_STAMP)
	@bash scripts/debian-deps.sh $(DEB_RUNTIME)

run: $(STAMP) deps
	$(VENV)/bin/sealgate proxy

lint: $(STAMP) $(MCP_STAMP)
	$(VENV)/bin/ruff check proxy issuer sandbox kube mcp sealgate tests bench scripts/typecheck \
		scripts/archmap scripts/test-images scripts/images
	$(PY) scripts/typecheck
	$(VENV)/bin/hadolint docker/Dockerfile

# The suite on parallel workers (pytest-xdist): a worker runs a module whole, and the modules
# that start sandboxes all on one, one after another, first (tests/conftest.py); each worker has
# a network namespace of its own. Most tests wait on real processes and sockets, so more
# workers than CPUs pay.
TEST_WORKERS ?= 3
test: $(STAMP) deps lint microvm-image test-images images ts-client promtool
	$(PY) -m pytest -q -n $(TEST_WORKERS) --no-loadscope-reorder

# Built before pytest: the test session's own network namespace cannot reach apt. A machine that
# cannot build it still tests everything else (the microVM tests skip, saying why).
.PHONY: microvm-image
microvm-image: $(STAMP)
	@bash scripts/debian-deps.sh $(DEB_MICROVM)
	@scripts/microvm-image >/dev/null || echo "note: no microVM guest image (its tests will skip)" >&2

# The busybox and debian OCI images under var/images-src/, built before pytest for the same
# reason; cached by their inputs (seconds when nothing changed). Without them their tests skip.
.PHONY: test-images
test-images:
	@bash scripts/debian-deps.sh $(DEB_IMAGES)
	@scripts/test-images || echo "note: no test images (the tests that need them will skip)" >&2

# sealgate's proxy and issuer images (docker/Dockerfile), built with podman from the debian test
# image's debootstrap'd bookworm and the locked wheels (scripts/images); podman's layer cache
# makes a build after a code change only reinstall sealgate's wheel. Without podman their test
# skips, saying why.
.PHONY: images
images: $(STAMP) test-images
	@$(PY) scripts/images

# promtool, Prometheus' own check of the metrics' exposition (tests/integration/test_metrics.py),
# from Debian's prometheus package unpacked into var/tools: installing the package would also
# enable a Prometheus server at every boot. Without it that check skips, saying why.
PROMTOOL := var/tools/promtool
.PHONY: promtool
promtool: $(PROMTOOL)
$(PROMTOOL):
	@mkdir -p var/tools/deb && cd var/tools/deb && rm -rf unpacked *.deb && \
	{ apt-get download prometheus >/dev/null 2>&1 || \
	  { apt-get update -qq >/dev/null 2>&1 && apt-get download prometheus >/dev/null 2>&1; }; } && \
	dpkg-deb -x prometheus_*.deb unpacked && cp unpacked/usr/bin/promtool ../promtool && \
	rm -rf unpacked *.deb || echo "note: no promtool (the exposition check will skip)" >&2

# The TypeScript client (sandbox/clients/typescript): its dev dependencies (typescript,
# @types/node) from its package-lock.json, again only when the lock changed, then `tsc` checks
# its JavaScript, types and tests (a type error fails here). It is plain JavaScript: its tests
# (tests/sandboxd/test_typescript_client.py) need only node, and skip without it. Before pytest:
# the test session's network namespace cannot reach npm.
TS_CLIENT := sandbox/clients/typescript
.PHONY: ts-client
ts-client:
	@if ! command -v node >/dev/null || ! command -v npm >/dev/null; then \
		echo "note: no node/npm: the TypeScript client is not checked (its tests will skip)" >&2; \
	elif ! { test $(TS_CLIENT)/node_modules/.package-lock.json -nt $(TS_CLIENT)/package-lock.json \
			|| (cd $(TS_CLIENT) && npm ci --no-audit --no-fund --loglevel=error); }; then \
		echo "note: npm ci failed: the TypeScript client is not type-checked" >&2; \
	else \
		cd $(TS_CLIENT) && npm run --silent check; \
	fi

bench: $(STAMP) deps test-images
	@bash scripts/debian-deps.sh $(DEB_BENCH)
	$(PY) bench/proxy_overhead.py
	$(PY) bench/injection_overhead.py
	$(PY) bench/sandbox_start.py
	$(PY) bench/sandbox_images.py
	$(PY) bench/sandbox_api.py
	$(PY) bench/soak.py

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache
