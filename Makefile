# Every build, vet and test goes through this file: static binaries
# (no cgo), the same flags for all.
GO          ?= go
export CGO_ENABLED := 0

VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS     := -s -w -X main.version=$(VERSION)
# urfave_cli_no_docs leaves out urfave/cli's markdown and man page
# writers (kc-janitor writes its own): their packages' initialisation
# cost every run its start-up. Every build, vet and test here uses
# them; internal/testutil.BuildTags is the same.
TAGS        := urfave_cli_no_docs

PREFIX      ?= /usr/local
DESTDIR     ?=
BINDIR      ?= $(PREFIX)/bin
LIBEXECDIR  ?= $(PREFIX)/libexec
HOOKDIR     ?= $(LIBEXECDIR)/oci/hooks.d
# Where podman reads hook descriptors, whatever PREFIX is: a descriptor in
# $(PREFIX)/share/... would never be read.
HOOKSDDIR   ?= /usr/share/containers/oci/hooks.d
MANDIR      ?= $(PREFIX)/share/man
UNITDIR     ?= $(PREFIX)/lib/systemd/system
SYSCONFDIR  ?= /etc
BASHCOMPDIR ?= $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR  ?= $(PREFIX)/share/zsh/site-functions
# The kc-janitor that generates the man page and completion scripts.
JANITOR     ?= bin/kc-janitor
UNITS       := contrib/systemd/kc-janitor.service contrib/systemd/kc-janitor.timer contrib/systemd/kc-janitor-watch.service \
               contrib/systemd/kc-janitor-container@.service contrib/systemd/kc-janitor-container@.timer
# systemctl --user units for rootless podman users (docs/ROOTLESS.md).
USERUNITDIR ?= $(PREFIX)/lib/systemd/user
USERUNITS   := contrib/systemd/user/kc-janitor.service contrib/systemd/user/kc-janitor.timer contrib/systemd/user/kc-janitor-watch.service

# Test knobs: KC_E2E=1 makes missing podman a failure instead of a skip.
TESTFLAGS   ?= -count=1 -timeout 15m
PKGS        ?= ./...

# One recipe at a time, -j or not: install-hooks must follow install-bin
# (a descriptor naming a missing kc-hook fails every container), and the
# builds parallelise inside go anyway.
.NOTPARALLEL:

.PHONY: all build built janitor-built test vet fmt docs pkgroot deb rpm deb-test rpm-test image install install-bin install-hooks install-units install-man install-completion uninstall demo bench bench-harness reliability fuzz clean

all: build

build:
	$(GO) build -trimpath -tags "$(TAGS)" -ldflags "$(LDFLAGS)" -o bin/kc-hook ./cmd/kc-hook
	$(GO) build -trimpath -tags "$(TAGS)" -ldflags "$(LDFLAGS)" -o bin/kc-janitor ./cmd/kc-janitor

vet:
	$(GO) vet -tags "$(TAGS)" ./...
	$(GO) vet -tags "reliability $(TAGS)" ./test/reliability/
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { gofmt -l .; echo 'gofmt needed'; exit 1; }

# go test -json through scripts/testsummary: go test's own output (ok/FAIL
# lines, failed tests' logs; everything with -v in TESTFLAGS), then the
# tests that were skipped and why; the exit status is go test's.
TESTSUMMARY := .tmp/testsummary
test: vet
	@mkdir -p $(dir $(TESTSUMMARY)) && $(GO) build -o $(TESTSUMMARY) ./scripts/testsummary
	$(TESTSUMMARY) $(GO) test -json -tags "$(TAGS)" $(TESTFLAGS) $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

# The documents generated from kc-janitor's flag definitions; a test fails
# when the committed copies differ from what this writes.
docs: build
	$(JANITOR) config-doc > docs/CONFIGURATION.md
	$(JANITOR) man > docs/man/kc-janitor.8

# Binaries, hook descriptors, systemd units (audit mode), the default
# settings file (never overwritten), the man page and shell completion.
# It copies bin/ and does not build: under sudo, Debian's secure_path has
# no Go, and root would build into its own caches.
install: install-bin install-hooks install-units install-man install-completion

# A binary or descriptor is written beside its place under a name no
# runtime reads (not *.json), then renamed over it: a container created
# meanwhile runs the old hook or the new one, never a missing or half
# written one.
install-bin: built
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(HOOKDIR)
	install -m 0755 bin/kc-janitor $(DESTDIR)$(BINDIR)/.kc-janitor.new
	mv -f $(DESTDIR)$(BINDIR)/.kc-janitor.new $(DESTDIR)$(BINDIR)/kc-janitor
	install -m 0755 bin/kc-hook $(DESTDIR)$(HOOKDIR)/.kc-hook.new
	mv -f $(DESTDIR)$(HOOKDIR)/.kc-hook.new $(DESTDIR)$(HOOKDIR)/kc-hook

# A descriptor naming a kc-hook that is not there fails every container
# its runtime creates: the binary comes first (make -j included).
# A descriptor of the same name that runs another kc-hook (the package's)
# is not replaced: the package would still list it as its own and run
# this install's hook. FORCE=1 replaces it.
install-hooks:
	@test -x $(DESTDIR)$(HOOKDIR)/kc-hook || { echo "$(DESTDIR)$(HOOKDIR)/kc-hook is not installed: run make install-bin first"; exit 1; }
	install -d $(DESTDIR)$(HOOKSDDIR)
	@for f in hooks.d/*.json; do \
		d=$(DESTDIR)$(HOOKSDDIR)/$$(basename $$f); \
		if [ -e $$d ] && [ "$(FORCE)" != 1 ] && ! grep -qF '"$(HOOKDIR)/kc-hook"' $$d; then \
			echo "$$d runs another kc-hook (a package's?): not replaced; FORCE=1 replaces it"; exit 1; \
		fi; \
	done
	for f in hooks.d/*.json; do \
		t=$(DESTDIR)$(HOOKSDDIR)/.$$(basename $$f).new; \
		sed 's|/usr/local/libexec/oci/hooks.d/kc-hook|$(HOOKDIR)/kc-hook|g' $$f > $$t && chmod 0644 $$t && \
			mv -f $$t $(DESTDIR)$(HOOKSDDIR)/$$(basename $$f) || exit 1; \
	done

install-units:
	install -d $(DESTDIR)$(USERUNITDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSCONFDIR)/default
	for f in $(UNITS); do \
		sed 's|/usr/local/bin/kc-janitor|$(BINDIR)/kc-janitor|g; s|/etc/default/kc-janitor|$(SYSCONFDIR)/default/kc-janitor|g' $$f > $(DESTDIR)$(UNITDIR)/$$(basename $$f) && \
			chmod 0644 $(DESTDIR)$(UNITDIR)/$$(basename $$f) || exit 1; \
	done
	test -e $(DESTDIR)$(SYSCONFDIR)/default/kc-janitor || \
		install -m 0644 contrib/systemd/kc-janitor.env $(DESTDIR)$(SYSCONFDIR)/default/kc-janitor
	for f in $(USERUNITS); do \
		sed 's|/usr/local/bin/kc-janitor|$(BINDIR)/kc-janitor|g' $$f > $(DESTDIR)$(USERUNITDIR)/$$(basename $$f) && \
			chmod 0644 $(DESTDIR)$(USERUNITDIR)/$$(basename $$f) || exit 1; \
	done

install-man: janitor-built
	install -d $(DESTDIR)$(MANDIR)/man8
	$(JANITOR) man > $(DESTDIR)$(MANDIR)/man8/kc-janitor.8
	chmod 0644 $(DESTDIR)$(MANDIR)/man8/kc-janitor.8
	install -m 0644 docs/man/kc-hook.8 $(DESTDIR)$(MANDIR)/man8/kc-hook.8

install-completion: janitor-built
	install -d $(DESTDIR)$(BASHCOMPDIR) $(DESTDIR)$(ZSHCOMPDIR)
	$(JANITOR) completion bash > $(DESTDIR)$(BASHCOMPDIR)/kc-janitor
	$(JANITOR) completion zsh > $(DESTDIR)$(ZSHCOMPDIR)/_kc-janitor
	chmod 0644 $(DESTDIR)$(BASHCOMPDIR)/kc-janitor $(DESTDIR)$(ZSHCOMPDIR)/_kc-janitor

# bin/ built from another commit than this tree's (a pull since) is not
# installed; where git cannot tell (VERSION is dev: no git, or a clone
# root's git does not trust without sudo's SUDO_UID), it is left out.
built: janitor-built
	@test -x bin/kc-hook -a -x bin/kc-janitor || { echo "bin/ is not built: run 'make build' first, as yourself"; exit 1; }
	@for b in kc-hook kc-janitor; do \
		v=$$(bin/$$b --version 2>/dev/null | awk '{print $$2}'); \
		[ '$(VERSION)' = dev ] || [ "$$v" = '$(VERSION)' ] || \
			{ echo "bin/$$b is version $$v, this tree is $(VERSION): run 'make build' first, as yourself"; exit 1; }; \
	done

janitor-built:
	@test -x $(JANITOR) || { echo "$(JANITOR) is not built: run 'make build' first, as yourself"; exit 1; }

# Leaves $(SYSCONFDIR)/default/kc-janitor (the operator's settings) alone.
# The hook descriptors before the binary they name: an engine that reads a
# descriptor whose hook is missing fails every container it creates. So
# it refuses while another file the runtimes read (containerd's base
# spec, an operator's descriptor; not in a comment) still names this
# kc-hook (FORCE=1 removes anyway), and removes only descriptors naming
# it (a package's own stay).
uninstall:
	@[ "$(FORCE)" = 1 ] || { \
		users=$$( { grep -RlsIE --include='*.json' --include='*.toml' --include='*.conf' -e '^[^#]*$(HOOKDIR)/kc-hook' \
			$(DESTDIR)/etc/containers $(DESTDIR)/etc/containerd $(DESTDIR)/etc/crio; \
			for h in $(DESTDIR)/root $(DESTDIR)/home/*; do \
				grep -rlsIE --include='*.json' --include='*.conf' -e '^[^#]*$(HOOKDIR)/kc-hook' $$h/.config/containers; \
			done; } | grep -vE '^$(DESTDIR)$(HOOKSDDIR)/kc-hook-[a-zA-Z]+\.json$$'); \
		[ -z "$$users" ] || { \
			echo "not uninstalled: these files still run $(HOOKDIR)/kc-hook, which uninstall deletes:"; \
			printf '  %s\n' $$users; \
			echo "every container they apply to would fail to start: edit or remove them first (restart containerd or CRI-O after); FORCE=1 uninstalls anyway"; \
			exit 1; }; }
	for f in hooks.d/*.json; do \
		d=$(DESTDIR)$(HOOKSDDIR)/$$(basename $$f); \
		if grep -qF '"$(HOOKDIR)/kc-hook"' $$d 2>/dev/null; then rm -f $$d; fi; \
	done
	rm -f $(DESTDIR)$(BINDIR)/kc-janitor $(DESTDIR)$(HOOKDIR)/kc-hook
	for f in $(UNITS); do rm -f $(DESTDIR)$(UNITDIR)/$$(basename $$f); done
	for f in $(USERUNITS); do rm -f $(DESTDIR)$(USERUNITDIR)/$$(basename $$f); done
	rm -f $(DESTDIR)$(MANDIR)/man8/kc-janitor.8 $(DESTDIR)$(MANDIR)/man8/kc-hook.8 $(DESTDIR)$(BASHCOMPDIR)/kc-janitor $(DESTDIR)$(ZSHCOMPDIR)/_kc-janitor

# Packages (DESIGN §15). nfpm runs from the module proxy at a fixed
# version, so nothing but Go is needed; the package's tree is what the
# install targets stage with PREFIX=/usr.
NFPM        ?= $(GO) run github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.45.2
PKGROOT     := .tmp/pkgroot
# dpkg and rpm want a version that starts with a digit: an untagged
# commit becomes 0.0.0~git.<hash>, which sorts before any release.
PKGVERSION  ?= $(shell echo '$(VERSION)' | sed -E 's/^v//; /^[0-9]+\./!s/^/0.0.0~git./; s/-/+/; s/-/./g')
PKGARCH     ?= $(shell $(GO) env GOARCH)

pkgroot: build
	rm -rf $(PKGROOT)
	$(MAKE) --no-print-directory install-bin install-hooks install-units install-man install-completion \
		DESTDIR=$(CURDIR)/$(PKGROOT) PREFIX=/usr HOOKDIR=/usr/libexec/kc-watchman SYSCONFDIR=/etc
	install -D -m 0644 README.md $(PKGROOT)/usr/share/doc/kc-watchman/README.md
	# containerd's base spec, naming the packaged kc-hook (contrib/containerd).
	install -d $(PKGROOT)/usr/share/kc-watchman/containerd
	sed 's|/usr/local/libexec/oci/hooks.d/kc-hook|/usr/libexec/kc-watchman/kc-hook|g' contrib/containerd/base-runtime-spec.json \
		> $(PKGROOT)/usr/share/kc-watchman/containerd/base-runtime-spec.json
	install -m 0644 contrib/containerd/config.toml $(PKGROOT)/usr/share/kc-watchman/containerd/config.toml

deb rpm: pkgroot
	mkdir -p dist
	KC_PKG_VERSION='$(PKGVERSION)' KC_PKG_ARCH=$(PKGARCH) \
		$(NFPM) package -f contrib/package/nfpm.yaml -p $@ -t dist/

# Installs the .deb into a throwaway dpkg root and purges it (test/package).
deb-test: deb
	./test/package/deb.sh dist/kc-watchman_$(PKGVERSION)-1_$(PKGARCH).deb

# rpm's names for Go's architectures.
RPMARCH     ?= $(subst 386,i386,$(subst arm64,aarch64,$(subst amd64,x86_64,$(PKGARCH))))

rpm-test: rpm
	./test/package/rpm.sh dist/kc-watchman-$(PKGVERSION)-1.$(RPMARCH).rpm

# The DaemonSet's image, offline: FROM scratch with the static binaries.
PODMAN      ?= podman
IMAGE       ?= localhost/kc-watchman:$(VERSION)
image: build
	$(PODMAN) build --pull=never -f contrib/kubernetes/Containerfile -t $(IMAGE) .

demo: build
	./scripts/demo.sh

bench:
	$(GO) test -tags "$(TAGS)" -run '^$$' -bench . -benchmem ./...

# The side-by-side harness of docs/PERFORMANCE.md (root; a few minutes).
# BENCH_ARGS example: -n 1000,10000 -podman off
bench-harness: build
	$(GO) run ./bench/cmd/kcbench $(BENCH_ARGS)

# The reliability suite of docs/RELIABILITY.md (root, real podman; a few
# minutes). KC_RELIABILITY_REPORT=FILE also writes its figures to FILE.
reliability:
	$(GO) test -tags "reliability $(TAGS)" $(TESTFLAGS) -v ./test/reliability/

# Every fuzz target (scripts/fuzz.sh lists them) for FUZZ_SECONDS each.
FUZZ_SECONDS ?= 20
fuzz:
	./scripts/fuzz.sh $(FUZZ_SECONDS)

clean:
	rm -rf bin dist $(PKGROOT)
