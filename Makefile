# The podman bindings build without cgo only with these tags; every build,
# vet and test goes through this file so nobody has to remember them.
GO          ?= go
TAGS        := remote containers_image_openpgp
GOFLAGS_ALL := -tags "$(TAGS)"
export CGO_ENABLED := 0

VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS     := -s -w -X main.version=$(VERSION)

PREFIX      ?= /usr/local
DESTDIR     ?=
BINDIR      ?= $(PREFIX)/bin
LIBEXECDIR  ?= $(PREFIX)/libexec
HOOKDIR     ?= $(LIBEXECDIR)/oci/hooks.d
HOOKSDDIR   ?= $(PREFIX)/share/containers/oci/hooks.d

# Test knobs: KC_E2E=1 makes missing podman a failure instead of a skip.
TESTFLAGS   ?= -count=1 -timeout 15m
PKGS        ?= ./...

.PHONY: all build test vet fmt install uninstall demo bench clean

all: build

build:
	$(GO) build $(GOFLAGS_ALL) -trimpath -ldflags "$(LDFLAGS)" -o bin/kc-hook ./cmd/kc-hook
	$(GO) build $(GOFLAGS_ALL) -trimpath -ldflags "$(LDFLAGS)" -o bin/kc-janitor ./cmd/kc-janitor

vet:
	$(GO) vet $(GOFLAGS_ALL) ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { gofmt -l .; echo 'gofmt needed'; exit 1; }

test: vet
	$(GO) test $(GOFLAGS_ALL) $(TESTFLAGS) $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

install: build
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(HOOKDIR) $(DESTDIR)$(HOOKSDDIR)
	install -m 0755 bin/kc-janitor $(DESTDIR)$(BINDIR)/kc-janitor
	install -m 0755 bin/kc-hook $(DESTDIR)$(HOOKDIR)/kc-hook
	for f in hooks.d/*.json; do \
		sed 's|/usr/local/libexec/oci/hooks.d/kc-hook|$(HOOKDIR)/kc-hook|g' $$f > $(DESTDIR)$(HOOKSDDIR)/$$(basename $$f); \
		chmod 0644 $(DESTDIR)$(HOOKSDDIR)/$$(basename $$f); \
	done

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/kc-janitor $(DESTDIR)$(HOOKDIR)/kc-hook
	for f in hooks.d/*.json; do rm -f $(DESTDIR)$(HOOKSDDIR)/$$(basename $$f); done

demo: build
	./scripts/demo.sh

bench:
	$(GO) test $(GOFLAGS_ALL) -run '^$$' -bench . -benchmem ./...

clean:
	rm -rf bin
