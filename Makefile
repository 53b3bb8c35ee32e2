# make build  builds bin/keyserver
# make run    builds and starts the daemon on the embedded SQLite default
# make test   runs every test, on SQLite and on PostgreSQL
# make bench  measures the daemon with keyserver-bench on SQLite and PostgreSQL
#             (BENCH_ARGS="--daemons 2", BENCH_ARGS="-phases sync": see docs/benchmarks.md)
GO       ?= go
ARGS     ?=
# goolm: mautrix-go's pure-Go Olm, for the tests that drive the server with
# it (internal/clientcompat); it changes nothing else.
TAGS     ?= goolm
TESTARGS ?= -race -count=1 -timeout 15m -tags $(TAGS)

.PHONY: build run test bench vet clean

build:
	$(GO) build -o bin/keyserver ./cmd/keyserver
	$(GO) build -o bin/keyserver-bench ./cmd/keyserver-bench

run: build
	./bin/keyserver $(ARGS)

test: vet
	scripts/with-postgres.sh $(GO) test $(TESTARGS) ./...

bench: build
	scripts/bench.sh $(BENCH_ARGS)

vet:
	$(GO) vet -tags $(TAGS) ./...

clean:
	rm -rf bin
