package doctor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// DefaultConfHooksDirs is podman's hooks_dir when no containers.conf sets
// one (containers.conf(5)).
var DefaultConfHooksDirs = []string{DefaultHooksDir}

// ConfPaths are where podman looks for containers.conf: the vendor file,
// the administrator's (with its .d drop-ins), the user's, and the UID
// podman runs as (above 0, the rootless overrides next to the
// administrator's file are read too).
type ConfPaths struct {
	Usr, Etc, Home string
	UID            int
}

// SystemConfPaths are the paths podman reads for the calling user: its
// UID is _CONTAINERS_ROOTLESS_UID when podman set it, else the real UID;
// its home $HOME, else the password database's.
func SystemConfPaths() ConfPaths {
	p := ConfPaths{Usr: "/usr/share/containers/containers.conf", Etc: "/etc/containers/containers.conf", UID: os.Getuid()}
	if u, err := strconv.Atoi(os.Getenv("_CONTAINERS_ROOTLESS_UID")); err == nil {
		p.UID = u
	}
	home := os.Getenv("HOME")
	if home == "" {
		if u, err := user.LookupId(strconv.Itoa(p.UID)); err == nil {
			home = u.HomeDir
		}
	}
	if x := os.Getenv("XDG_CONFIG_HOME"); x != "" {
		p.Home = filepath.Join(x, "containers", "containers.conf")
	} else if home != "" {
		p.Home = filepath.Join(home, ".config", "containers", "containers.conf")
	}
	return p
}

// ConfHooksDirs returns the hooks_dir of [engine] as podman would load it
// from containers.conf: $CONTAINERS_CONF alone if set (it must exist),
// else the vendor file, the administrator's and its .d, for a rootless
// user containers.rootless.conf, its .d and .d/<UID>, then the user's and
// its .d; $CONTAINERS_CONF_OVERRIDE last. As podman's attributed lists
// do, each file that sets hooks_dir replaces what came before, unless an
// {append=true} in its list (or in an earlier file's: the flag carries
// over) makes it append. getenv is os.Getenv outside tests.
//
// Reading the files here rather than through podman's own config package
// keeps that package, and its start-up cost, out of every kc-janitor run:
// only doctor asks.
func ConfHooksDirs(p ConfPaths, getenv func(string) string) ([]string, error) {
	var files []string
	if f := getenv("CONTAINERS_CONF"); f != "" {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("CONTAINERS_CONF file: %w", err)
		}
		files = []string{f}
	} else {
		files = append(files, p.Usr, p.Etc)
		files = append(files, dropIns(p.Etc+".d")...)
		if p.UID > 0 {
			rootless := filepath.Join(filepath.Dir(p.Etc), "containers.rootless.conf")
			files = append(files, rootless)
			files = append(files, dropIns(rootless+".d")...)
			files = append(files, dropIns(filepath.Join(rootless+".d", strconv.Itoa(p.UID)))...)
		}
		if p.Home != "" {
			files = append(files, p.Home)
			files = append(files, dropIns(p.Home+".d")...)
		}
	}
	if f := getenv("CONTAINERS_CONF_OVERRIDE"); f != "" {
		files = append(files, f)
	}
	dirs := slices.Clone(DefaultConfHooksDirs)
	var appending *bool
	for _, f := range files {
		set, err := readHooksDir(f, &appending)
		if err != nil {
			return nil, err
		}
		switch {
		case set == nil:
		case appending != nil && *appending:
			dirs = append(dirs, set...)
		default:
			dirs = set
		}
	}
	return dirs, nil
}

// dropIns lists a drop-in directory's *.conf files in name order; none
// when it does not exist or cannot be read (as podman does for the
// former; the latter is podman's error, which doctor then reports by the
// hooks dirs it looks in).
func dropIns(dir string) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".conf") {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out
}

// maxConfFile caps one containers.conf or hook descriptor read: the files
// are root's, but a user's own are read too.
const maxConfFile = 1 << 20

// readHooksDir reads one file's [engine] hooks_dir: nil when the file does
// not exist or does not set it. An {append=BOOL} anywhere in the list
// sets *appending, for this file and the ones after it.
func readHooksDir(file string, appending **bool) ([]string, error) {
	data, err := readConfig(file, maxConfFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("containers.conf: %w", err)
	}
	var conf struct {
		Engine struct {
			HooksDir []any `toml:"hooks_dir"`
		} `toml:"engine"`
	}
	if _, err := toml.Decode(string(data), &conf); err != nil {
		return nil, fmt.Errorf("containers.conf %s: %w", file, err)
	}
	if conf.Engine.HooksDir == nil {
		return nil, nil
	}
	dirs := []string{}
	for i, v := range conf.Engine.HooksDir {
		switch v := v.(type) {
		case string:
			dirs = append(dirs, v)
		case map[string]any:
			for k, a := range v {
				b, ok := a.(bool)
				if k != "append" || !ok {
					return nil, fmt.Errorf("containers.conf %s: hooks_dir: entry %d: %s = %v is not an {append=true|false}", file, i, k, a)
				}
				*appending = &b
			}
		default:
			return nil, fmt.Errorf("containers.conf %s: hooks_dir: entry %d is not a path", file, i)
		}
	}
	return dirs, nil
}
