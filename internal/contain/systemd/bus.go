package systemd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/godbus/dbus/v5"
)

const (
	busName     = "org.freedesktop.systemd1"
	managerPath = dbus.ObjectPath("/org/freedesktop/systemd1")
	managerIf   = "org.freedesktop.systemd1.Manager"

	// callTimeout bounds a call whose context has no deadline: the 25
	// seconds sd-bus and libdbus wait for a reply by default.
	callTimeout = 25 * time.Second

	// defaultSystemBus is the system bus where DBUS_SYSTEM_BUS_ADDRESS
	// does not name another (the D-Bus specification's default).
	defaultSystemBus = "unix:path=/run/dbus/system_bus_socket"
)

// Booted reports whether the system under root was booted with systemd
// as PID 1, as sd_booted(3) decides it: /run/systemd/system is a
// directory. root is "/" except in tests.
func Booted(root string) bool {
	// Stat, not Lstat: sd_booted checks "/run/systemd/system/", whose
	// trailing slash resolves a symlink to a directory.
	fi, err := os.Stat(filepath.Join(root, "run/systemd/system"))
	return err == nil && fi.IsDir()
}

// SystemBusAddress is the address Dial uses for "": DBUS_SYSTEM_BUS_ADDRESS
// if set, else the well-known system bus socket.
func SystemBusAddress() string {
	if a := os.Getenv("DBUS_SYSTEM_BUS_ADDRESS"); a != "" {
		return a
	}
	return defaultSystemBus
}

// UserBusAddress is the bus of the calling user's own service manager,
// which a rootless caller asks for its scope: DBUS_SESSION_BUS_ADDRESS if
// set, else $XDG_RUNTIME_DIR/bus, the order sd_bus_open_user(3) uses.
func UserBusAddress() (string, error) {
	if a := os.Getenv("DBUS_SESSION_BUS_ADDRESS"); a != "" {
		return a, nil
	}
	dir := os.Getenv("XDG_RUNTIME_DIR")
	if dir == "" || !filepath.IsAbs(dir) {
		return "", errors.New("no user bus: neither DBUS_SESSION_BUS_ADDRESS nor an absolute XDG_RUNTIME_DIR is set")
	}
	return "unix:path=" + escapeAddress(filepath.Join(dir, "bus")), nil
}

// escapeAddress escapes a value for a D-Bus address: every byte outside
// the specification's optionally-escaped set becomes %XX.
func escapeAddress(s string) string {
	const hex = "0123456789abcdef"
	var b []byte
	for _, c := range []byte(s) {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '-' || c == '_' || c == '/' || c == '.' || c == '\\' || c == '*' {
			b = append(b, c)
			continue
		}
		b = append(b, '%', hex[c>>4], hex[c&0xf])
	}
	return string(b)
}

// Manager is a connection to a systemd service manager over D-Bus. Its
// methods may be called from several goroutines.
type Manager struct {
	conn   *dbus.Conn
	cancel context.CancelFunc
}

// Dial connects to the systemd manager on the bus at address; "" is the
// system bus (SystemBusAddress). ctx bounds the connection, the
// authentication and the bus handshake; once Dial returns, the connection
// lives until Close.
func Dial(ctx context.Context, address string) (*Manager, error) {
	if address == "" {
		address = SystemBusAddress()
	}
	return dial(ctx, address)
}

// DialUser connects to the calling user's own systemd manager on the user
// bus (UserBusAddress): where systemd delegates to a user, that manager
// starts the user's scopes.
func DialUser(ctx context.Context) (*Manager, error) {
	address, err := UserBusAddress()
	if err != nil {
		return nil, err
	}
	return dial(ctx, address)
}

// bounded gives ctx a deadline if it has none.
func bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, callTimeout)
}

// checkAddress accepts only unix-socket transports: systemd listens on
// nothing else, and a TCP "system bus" from the environment would be
// anybody's.
func checkAddress(address string) error {
	for _, a := range strings.Split(address, ";") {
		if !strings.HasPrefix(a, "unix:") {
			return fmt.Errorf("D-Bus address %q: only unix: transports reach systemd", address)
		}
	}
	return nil
}

func dial(ctx context.Context, address string) (*Manager, error) {
	if err := checkAddress(address); err != nil {
		return nil, err
	}
	ctx, cancelCall := bounded(ctx)
	defer cancelCall()
	// godbus's authentication and Hello take no context; the connection's
	// own context closes it, which fails whatever read is blocked. It is
	// cancelled when ctx ends while dialling and detached from ctx after.
	life, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, cancel)
	// EXTERNAL alone: the kernel vouches for the UID. The cookie
	// mechanism would have a root hook read files under $HOME.
	conn, err := dbus.Connect(address,
		dbus.WithContext(life),
		dbus.WithAuth(dbus.AuthExternal(strconv.Itoa(os.Getuid()))))
	if !stop() || err != nil {
		cancel()
		if conn != nil {
			conn.Close()
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, fmt.Errorf("connecting to systemd over D-Bus at %s: %w", address, ctxErr)
		}
		return nil, fmt.Errorf("connecting to systemd over D-Bus at %s: %w", address, err)
	}
	// systemd sends JobRemoved to the client that queued the job without
	// a Subscribe call (its job tracks the sender), but the bus routes a
	// broadcast signal only to connections that asked for it.
	err = conn.AddMatchSignalContext(ctx,
		dbus.WithMatchSender(busName),
		dbus.WithMatchObjectPath(managerPath),
		dbus.WithMatchInterface(managerIf),
		dbus.WithMatchMember("JobRemoved"))
	if err != nil {
		cancel()
		conn.Close()
		return nil, fmt.Errorf("asking the D-Bus daemon at %s for systemd's job signals: %w", address, err)
	}
	return &Manager{conn: conn, cancel: cancel}, nil
}

// Close closes the connection. A scope already started lives on: systemd
// owns it.
func (m *Manager) Close() error {
	defer m.cancel()
	return m.conn.Close()
}
