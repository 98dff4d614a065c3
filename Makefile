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

.PHONY: run test lint unit deps bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $@

# Installs missing Debian packages when root; otherwise says what is missing and goes on
# (tests that need them skip with that reason).
deps:
	@bash scripts/debian-deps.sh $(DEB_RUNTIME)

run: $(STAMP) deps
	$(VENV)/bin/sealgate proxy

lint: $(STAMP)
	$(VENV)/bin/ruff check proxy issuer sandbox sealgate tests bench
	$(VENV)/bin/mypy --strict sealgate

test: $(STAMP) deps lint
	$(PY) -m pytest -q

bench: $(STAMP) deps
	@bash scripts/debian-deps.sh $(DEB_BENCH)
	$(PY) bench/proxy_overhead.py
	$(PY) bench/injection_overhead.py
	$(PY) bench/sandbox_start.py
	$(PY) bench/soak.py

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache
