# make build  builds bin/keyserver
# make run    builds and starts the daemon on the embedded SQLite default
# make test   runs every test, on SQLite and on PostgreSQL
# make soak   runs the convergence test long: SEED=n DURATION=2m SERVERS=4 USERS=3 RUNS=1
#             (faults for DURATION, then every server must agree within 30 s;
#             each of RUNS runs takes a new random seed unless SEED is set)
# make bench  measures the daemon with keyserver-bench on SQLite and PostgreSQL
#             (BENCH_ARGS="--daemons 2", BENCH_ARGS="-phases sync": see docs/benchmarks.md)
GO       ?= go
ARGS     ?=
# goolm: mautrix-go's pure-Go Olm, for the tests that drive the server with
# it (internal/clientcompat); it changes nothing else.
TAGS     ?= goolm
TESTARGS ?= -race -count=1 -timeout 15m -tags $(TAGS)

SEED     ?=
DURATION ?= 2m
SERVERS  ?= 4
USERS    ?= 3
RUNS     ?= 1

.PHONY: build run test soak bench vet clean

build:
	$(GO) build -o bin/keyserver ./cmd/keyserver
	$(GO) build -o bin/keyserver-bench ./cmd/keyserver-bench

run: build
	./bin/keyserver $(ARGS)

# The longest packages are named first so that they start first: the two
# cores then share the others while those run (./... adds the rest once).
LONGTESTS ?= ./federationapi/ ./clientapi/

test: vet
	scripts/with-postgres.sh $(GO) test $(TESTARGS) $(LONGTESTS) ./...

soak:
	KEYSERVER_CONVERGENCE_SEED=$(SEED) KEYSERVER_CONVERGENCE_DURATION=$(DURATION) \
	KEYSERVER_CONVERGENCE_SERVERS=$(SERVERS) KEYSERVER_CONVERGENCE_USERS=$(USERS) \
	scripts/with-postgres.sh $(GO) test -count=$(RUNS) -timeout 4h -tags $(TAGS) -v -run '^TestConvergence$$' ./internal/convergence/

bench: build
	scripts/bench.sh $(BENCH_ARGS)

vet:
	$(GO) vet -tags $(TAGS) ./...

clean:
	rm -rf bin
