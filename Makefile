# raylog: `make demo` runs the end-to-end demo, `make test` runs the test suite.
# Both create .venv with the pinned dependencies (constraints.txt) on first use.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# `make test` runs the suite on this many workers (pytest-xdist); TEST_WORKERS=0 runs it in one process
# (three on two cores took as long as two, 49:35 against 49:38, and made timing tests flaky)
TEST_WORKERS ?= 2
STAMP  := $(VENV)/.installed-stamp
# tools the tests use that no Python package brings (KafkaJS), project-local
TOOLS  ?= .tools
KAFKAJS_VERSION := 2.2.4
# the Spark reader's jar (raylog_spark/jars/), built again when its Java sources change
SPARK_JAR    := $(VENV)/.spark-jar-stamp
JAVA_SOURCES := $(shell find integrations/spark/java -type f -not -name '.*')
# the venv of the Quix Streams apps (apps/quix/), with pins of its own (apps/quix/constraints.txt)
QUIX_VENV        ?= .venv-apps/quix
QUIX_CONSTRAINTS := apps/quix/constraints.txt
# the venv of the Faust apps (apps/faust/), with pins of its own (apps/faust/constraints.txt)
FAUST_VENV        ?= .venv-apps/faust
FAUST_CONSTRAINTS := apps/faust/constraints.txt

.PHONY: demo test bench docs venv clean hosts-tools venv-quix venv-faust

venv: $(STAMP) $(SPARK_JAR) hosts-tools venv-quix venv-faust

# system tools the tests use, installed when missing and this runs as root with apt-get (else the
# tests that need them skip and say why): nftables, for the network faults of the hosts kit
# (raylog/testing/hosts.py), kcat, a Kafka client on Debian's own librdkafka (tests/kafka), Go and
# Debian's sarama, a Go Kafka client (apps/sarama, built by tests/kafka/test_kafka_sarama.py), and, where
# node and npm are, KafkaJS into $(TOOLS)/node_modules (tests/kafka/test_kafka_kafkajs.py)
hosts-tools:
	@command -v nft >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1 || { \
		echo "installing nftables (the hosts kit's network faults) ..."; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables; } >/dev/null 2>&1 \
		|| echo "note: nftables could not be installed; the hosts kit's tests will skip"; }
	@command -v kcat >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1 || { \
		echo "installing kcat (a Kafka client for the front door's tests) ..."; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat; } >/dev/null 2>&1 \
		|| echo "note: kcat could not be installed; the kcat tests will skip"; }
	@{ command -v go >/dev/null 2>&1 && [ -d /usr/share/gocode/src/github.com/Shopify/sarama ]; } || [ "$$(id -u)" != 0 ] \
		|| ! command -v apt-get >/dev/null 2>&1 || { \
		echo "installing Go and sarama (a Go Kafka client for the front door's tests) ..."; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go \
			golang-github-shopify-sarama-dev golang-github-xdg-go-scram-dev; } >/dev/null 2>&1 \
		|| echo "note: Go and sarama could not be installed; the sarama tests will skip"; }
	@[ -f $(TOOLS)/node_modules/kafkajs/package.json ] || ! command -v npm >/dev/null 2>&1 || { \
		echo "installing KafkaJS $(KAFKAJS_VERSION) into $(TOOLS) (a Node.js Kafka client for the front door's tests) ..."; \
		npm install --silent --no-audit --no-fund --prefix $(TOOLS) kafkajs@$(KAFKAJS_VERSION) >/dev/null 2>&1 \
		|| echo "note: KafkaJS could not be installed; the KafkaJS tests will skip"; }

# Quix Streams in a venv of its own (it caps confluent-kafka and pydantic below constraints.txt's
# pins), made again when $(QUIX_CONSTRAINTS) changes: its sha256 is the venv's stamp (the same
# check as tests/kafka/test_kafka_quix.py's). Without the package index it is not made and the
# Quix tests skip and say why; pip's output goes to $(QUIX_VENV).install.log
venv-quix:
	@want="$$(sha256sum $(QUIX_CONSTRAINTS) | cut -d' ' -f1)"; \
	[ "$$(cat $(QUIX_VENV)/.constraints-sha256 2>/dev/null)" = "$$want" ] || { \
		echo "setting up $(QUIX_VENV) with Quix Streams ($(QUIX_CONSTRAINTS); log in $(QUIX_VENV).install.log) ..."; \
		rm -rf $(QUIX_VENV) && mkdir -p $(dir $(QUIX_VENV)) && $(PYTHON) -m venv $(QUIX_VENV) \
		&& $(QUIX_VENV)/bin/python -m pip install -c $(QUIX_CONSTRAINTS) quixstreams > $(QUIX_VENV).install.log 2>&1 \
		&& echo "$$want" > $(QUIX_VENV)/.constraints-sha256 \
		|| echo "note: Quix Streams could not be installed (see $(QUIX_VENV).install.log); the Quix tests will skip"; }

# Faust (faust-streaming) in a venv of its own, made again when $(FAUST_CONSTRAINTS) changes (its
# sha256 is the venv's stamp, as tests/kafka/test_kafka_faust.py checks). Without the package index
# it is not made and the Faust tests skip and say why; pip's output goes to $(FAUST_VENV).install.log
venv-faust:
	@want="$$(sha256sum $(FAUST_CONSTRAINTS) | cut -d' ' -f1)"; \
	[ "$$(cat $(FAUST_VENV)/.constraints-sha256 2>/dev/null)" = "$$want" ] || { \
		echo "setting up $(FAUST_VENV) with Faust ($(FAUST_CONSTRAINTS); log in $(FAUST_VENV).install.log) ..."; \
		rm -rf $(FAUST_VENV) && mkdir -p $(dir $(FAUST_VENV)) && $(PYTHON) -m venv $(FAUST_VENV) \
		&& $(FAUST_VENV)/bin/python -m pip install -c $(FAUST_CONSTRAINTS) faust-streaming > $(FAUST_VENV).install.log 2>&1 \
		&& echo "$$want" > $(FAUST_VENV)/.constraints-sha256 \
		|| echo "note: Faust could not be installed (see $(FAUST_VENV).install.log); the Faust tests will skip"; }

# pip's output goes to $(VENV)/install.log; on failure its tail is shown
$(STAMP): pyproject.toml constraints.txt setup.py raylog/storage/_speedups.c raylog/storage/_compaction.c raylog/producer/_fastsend.c raylog/kafka/_kafkarecords.c \
		raylog/producer/_groupfill.c raylog/producer/_slots.h
	@echo "setting up $(VENV) with the pinned dependencies (once; log in $(VENV)/install.log) ..."
	@$(PYTHON) -m venv $(VENV)
	@{ $(PY) -m pip install --upgrade pip && $(PY) -m pip install -c constraints.txt -e '.[test,bench,docs]'; } \
		> $(VENV)/install.log 2>&1 \
		|| { tail -n 40 $(VENV)/install.log; echo "error: installing the dependencies failed; see $(VENV)/install.log"; exit 1; }
	@touch $(STAMP)

$(SPARK_JAR): $(STAMP) $(JAVA_SOURCES)
	@$(PY) -m raylog_spark.jvm >> $(VENV)/install.log 2>&1 || echo "note: the Spark reader's jar was not built (see $(VENV)/install.log); raylog_spark builds it with javac on first use"
	@touch $(SPARK_JAR)

demo: $(STAMP) $(SPARK_JAR)
	$(PY) -m raylog.tools.demo

# the tests of one module stay on one worker (they share its fixtures), and so do all the hosts
# kit's (one shared HostsCluster, started first: tests/conftest.py)
test: $(STAMP) $(SPARK_JAR) hosts-tools venv-quix venv-faust
	$(PY) -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder)

bench: $(STAMP) $(SPARK_JAR)
	$(PY) bench/storage.py
	$(PY) bench/throughput.py
	$(PY) bench/rebalance.py

# the documentation site (docs/, mkdocs.yml) into site/, warnings as errors
docs: $(STAMP)
	$(PY) -m mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .venv-apps build site *.egg-info raylog/storage/_speedups*.so raylog/storage/_compaction*.so raylog/kafka/_kafkarecords*.so integrations/spark/raylog_spark/jars
