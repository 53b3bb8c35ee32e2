# make build  builds bin/keyserver
# make run    builds and starts the daemon on the embedded SQLite default
# make test   runs every test, on SQLite and on PostgreSQL
GO       ?= go
ARGS     ?=
TESTARGS ?= -race -count=1 -timeout 15m

.PHONY: build run test vet clean

build:
	$(GO) build -o bin/keyserver ./cmd/keyserver

run: build
	./bin/keyserver $(ARGS)

test: vet
	scripts/with-postgres.sh $(GO) test $(TESTARGS) ./...

vet:
	$(GO) vet ./...

clean:
	rm -rf bin
