package systemd

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestCheckScopeName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"kc-watchman-0123abcd.scope", true},
		{"kc_w:x.y-z.scope", true},
		{"A.scope", true},
		{".scope", false},
		{"scope", false},
		{"kc.service", false},
		{"kc.slice", false},
		{"_kc.scope", false},
		{".kc.scope", false},
		{"-kc.scope", false},
		{"kc/x.scope", false},
		{"kc@x.scope", false},
		{`kc\x2d.scope`, false},
		{"kc x.scope", false},
		{"kc\x00.scope", false},
		{"kç.scope", false},
		{strings.Repeat("a", 249) + ".scope", true},  // 255 characters
		{strings.Repeat("a", 250) + ".scope", false}, // 256
	} {
		t.Run(fmt.Sprintf("%.40q", tc.name), func(t *testing.T) {
			if err := CheckScopeName(tc.name); (err == nil) != tc.ok {
				t.Errorf("CheckScopeName(%q) = %v, want ok %v", tc.name, err, tc.ok)
			}
		})
	}
}

func TestSlicePath(t *testing.T) {
	for _, tc := range []struct {
		slice, want string
	}{
		{"kc-watchman.slice", "/kc.slice/kc-watchman.slice"},
		{"kcwatchman.slice", "/kcwatchman.slice"},
		{"a-b-c.slice", "/a.slice/a-b.slice/a-b-c.slice"},
		{"-.slice", ""},
		{"a-.slice", ""},
		{"a--b.slice", ""},
		{"a.scope", ""},
	} {
		t.Run(tc.slice, func(t *testing.T) {
			got, err := SlicePath(tc.slice)
			if tc.want == "" {
				if err == nil {
					t.Errorf("SlicePath(%q) = %q, want an error", tc.slice, got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("SlicePath(%q) = %q, %v; want %q", tc.slice, got, err, tc.want)
			}
		})
	}
}

func TestCheckControlGroup(t *testing.T) {
	for _, tc := range []struct {
		cg string
		ok bool
	}{
		{"/kc.slice/kc-watchman.slice/kc-test.scope", true},
		{"/user.slice/user-1000.slice/user@1000.service/kc.slice/kc-watchman.slice/kc-test.scope", true},
		{"/_kc.slice/kc-watchman.slice/_kc-test.scope", true},
		{"/kc-watchman.slice/kc-test.scope", false},
		{"/kc.slice/kc-watchman.slice/kc-test.scope/", false},
		{"/kc.slice/kc-watchman.slice/kc-test.scope/sub", false},
		{"/kc.slice/kc-watchman.slice//kc-test.scope", false},
		{"/kc.slice/kc-watchman.slice/./kc-test.scope", false},
		{"/x/../kc.slice/kc-watchman.slice/kc-test.scope", false},
		{"kc.slice/kc-watchman.slice/kc-test.scope", false},
		{"/kc.slice/kc-watchman.slice/__kc-test.scope", false},
		{"/system.slice/kc-test.scope", false},
		{"/", false},
		{"", false},
		{"/kc.slice/kc-watchman.slice/kc-test.scope\x00", false},
		{"/" + strings.Repeat("a/", 2100) + "kc.slice/kc-watchman.slice/kc-test.scope", false},
	} {
		t.Run(fmt.Sprintf("%.60q", tc.cg), func(t *testing.T) {
			err := checkControlGroup(tc.cg, "kc-test.scope", "kc-watchman.slice")
			if (err == nil) != tc.ok {
				t.Errorf("checkControlGroup(%q) = %v, want ok %v", tc.cg, err, tc.ok)
			}
			if err != nil && !errors.Is(err, errOutside) {
				t.Errorf("error %q is not errOutside", err)
			}
		})
	}
}

func TestUserBusAddress(t *testing.T) {
	t.Setenv("DBUS_SESSION_BUS_ADDRESS", "")
	t.Setenv("XDG_RUNTIME_DIR", "/run/user/1000 x;y")
	got, err := UserBusAddress()
	if want := "unix:path=/run/user/1000%20x%3by/bus"; err != nil || got != want {
		t.Errorf("UserBusAddress() = %q, %v; want %q", got, err, want)
	}
	t.Setenv("XDG_RUNTIME_DIR", "relative")
	if got, err := UserBusAddress(); err == nil {
		t.Errorf("UserBusAddress() with a relative XDG_RUNTIME_DIR = %q", got)
	}
	t.Setenv("DBUS_SESSION_BUS_ADDRESS", "unix:path=/elsewhere")
	if got, err := UserBusAddress(); err != nil || got != "unix:path=/elsewhere" {
		t.Errorf("UserBusAddress() = %q, %v; want DBUS_SESSION_BUS_ADDRESS", got, err)
	}
}
