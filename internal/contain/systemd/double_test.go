package systemd

// The D-Bus double: a private dbus-daemon on a socket in t.TempDir() and,
// in the test process, a fake org.freedesktop.systemd1 Manager. The
// machines these tests run on do not run systemd as PID 1, so this is the
// only systemd the package meets in tests; the double answers with the
// names, signatures and errors systemd documents in
// org.freedesktop.systemd1(5).

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
)

const busConfig = `<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path=%s</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
`

// startBus starts a private dbus-daemon listening on dir/bus and returns
// its address. The daemon is killed and reaped when the test ends.
func startBus(t *testing.T, dir string) string {
	t.Helper()
	daemon, err := exec.LookPath("dbus-daemon")
	if err != nil {
		t.Skip("dbus-daemon is not installed: the D-Bus double needs a private bus")
	}
	conf := filepath.Join(t.TempDir(), "bus.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, busConfig, escapeAddress(filepath.Join(dir, "bus"))), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(daemon, "--config-file="+conf, "--print-address", "--nofork", "--nopidfile")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	// The daemon dies with the test binary even if cleanup never runs.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting dbus-daemon: %v", err)
	}
	stop := func() {
		cmd.Process.Kill()
		cmd.Wait()
	}
	t.Cleanup(stop)
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- strings.TrimSpace(s)
	}()
	select {
	case addr := <-line:
		if addr == "" {
			stop()
			t.Fatalf("dbus-daemon printed no address: %s", stderr.Bytes())
		}
		return addr
	case <-time.After(10 * time.Second):
		stop()
		t.Fatalf("dbus-daemon printed no address in 10s: %s", stderr.Bytes())
	}
	return ""
}

// startCall is one StartTransientUnit the double received.
type startCall struct {
	Signature string // of the whole message body
	Name      string
	Mode      string
	Props     map[string]dbus.Variant
	Order     []string // property names in the order sent
	Aux       int
}

// fakeSystemd is the double's Manager. Its behaviour fields are set before
// the client calls; its record is read after.
type fakeSystemd struct {
	conn   *dbus.Conn
	forger *dbus.Conn // another connection, for signals not from systemd
	hang   chan struct{}

	// Behaviour.
	startErr   *dbus.Error
	stopErr    *dbus.Error
	getUnitErr *dbus.Error
	result     string // the job's JobRemoved result; "" never sends one
	before     bool   // JobRemoved before the method's reply
	decoy      bool   // first a JobRemoved "failed" for another job
	forge      bool   // a JobRemoved "done" from a connection not systemd's
	hangCall   bool   // the method never answers
	cg         dbus.Variant

	mu     sync.Mutex
	job    uint32
	starts []startCall
	stops  [][2]string
}

// newSystemd starts a private bus with a fake systemd on it and returns
// the fake and the bus address.
func newSystemd(t *testing.T) (*fakeSystemd, string) {
	t.Helper()
	addr := startBus(t, t.TempDir())
	f := &fakeSystemd{
		hang: make(chan struct{}),
		cg:   dbus.MakeVariant("/kc.slice/kc-watchman.slice/kc-test.scope"),
	}
	var err error
	f.conn, err = dbus.Connect(addr)
	if err != nil {
		t.Fatalf("fake systemd connecting to the private bus: %v", err)
	}
	t.Cleanup(func() { f.conn.Close() })
	f.forger, err = dbus.Connect(addr)
	if err != nil {
		t.Fatalf("forger connecting to the private bus: %v", err)
	}
	t.Cleanup(func() { f.forger.Close() })
	// Registered last, so it runs first: a hung method returns before its
	// connection closes.
	t.Cleanup(func() { close(f.hang) })
	if err := f.conn.Export(manager{f}, managerPath, managerIf); err != nil {
		t.Fatal(err)
	}
	reply, err := f.conn.RequestName(busName, dbus.NameFlagDoNotQueue)
	if err != nil || reply != dbus.RequestNameReplyPrimaryOwner {
		t.Fatalf("fake systemd taking %s: reply %v, %v", busName, reply, err)
	}
	return f, addr
}

// manager carries only the exported D-Bus methods: godbus exports every
// method of the value it is given.
type manager struct{ f *fakeSystemd }

func (m manager) StartTransientUnit(msg dbus.Message, name, mode string, props []property, aux []auxUnit) (dbus.ObjectPath, *dbus.Error) {
	f := m.f
	call := startCall{Name: name, Mode: mode, Props: map[string]dbus.Variant{}, Aux: len(aux)}
	if sig, ok := msg.Headers[dbus.FieldSignature].Value().(dbus.Signature); ok {
		call.Signature = sig.String()
	}
	for _, p := range props {
		call.Props[p.Name] = p.Value
		call.Order = append(call.Order, p.Name)
	}
	f.mu.Lock()
	f.starts = append(f.starts, call)
	f.mu.Unlock()
	if f.startErr != nil {
		return "", f.startErr
	}
	return f.queue(name)
}

func (m manager) StopUnit(name, mode string) (dbus.ObjectPath, *dbus.Error) {
	f := m.f
	f.mu.Lock()
	f.stops = append(f.stops, [2]string{name, mode})
	f.mu.Unlock()
	if f.stopErr != nil {
		return "", f.stopErr
	}
	return f.queue(name)
}

func (m manager) GetUnit(name string) (dbus.ObjectPath, *dbus.Error) {
	f := m.f
	if f.getUnitErr != nil {
		return "", f.getUnitErr
	}
	path := dbus.ObjectPath("/org/freedesktop/systemd1/unit/" + strings.NewReplacer("-", "_2d", ".", "_2e").Replace(name))
	if err := f.conn.Export(unitProps{f}, path, "org.freedesktop.DBus.Properties"); err != nil {
		return "", dbus.MakeFailedError(err)
	}
	return path, nil
}

// queue is systemd's side of a queued job: a job path now, and a
// JobRemoved with the configured result before or after the reply.
func (f *fakeSystemd) queue(unit string) (dbus.ObjectPath, *dbus.Error) {
	if f.hangCall {
		<-f.hang
		return "", dbus.MakeFailedError(fmt.Errorf("test over"))
	}
	f.mu.Lock()
	f.job++
	id := f.job
	f.mu.Unlock()
	job := dbus.ObjectPath(fmt.Sprintf("/org/freedesktop/systemd1/job/%d", id))
	removed := func() {
		if f.result != "" {
			f.conn.Emit(managerPath, managerIf+".JobRemoved", id, job, unit, f.result)
		}
	}
	if f.decoy {
		other := dbus.ObjectPath(fmt.Sprintf("/org/freedesktop/systemd1/job/%d", id+1000))
		f.conn.Emit(managerPath, managerIf+".JobRemoved", id+1000, other, "other.scope", "failed")
	}
	if f.forge {
		f.forger.Emit(managerPath, managerIf+".JobRemoved", id, job, unit, "done")
	}
	if f.before {
		removed()
	} else {
		go removed()
	}
	return job, nil
}

type unitProps struct{ f *fakeSystemd }

func (u unitProps) Get(iface, name string) (dbus.Variant, *dbus.Error) {
	if iface != "org.freedesktop.systemd1.Scope" || name != "ControlGroup" {
		return dbus.Variant{}, dbus.NewError("org.freedesktop.DBus.Error.UnknownProperty", []any{iface + "." + name})
	}
	return u.f.cg, nil
}

func (f *fakeSystemd) record() ([]startCall, [][2]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]startCall(nil), f.starts...), append([][2]string(nil), f.stops...)
}
