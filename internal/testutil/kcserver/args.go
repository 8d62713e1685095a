package main

import (
	"fmt"
	"strconv"
	"strings"
)

// options are real kcserver's command-line flags (0.1.64).
type options struct {
	port           int
	transport      string // tcp, socket or named-pipe
	socketDir      string
	unixSocket     string
	connectionFile string
	idleHours      int // -1: never
	token          string
	logFile        string
	logLevel       string
	sampleInterval int
	help, version  bool
}

// valueFlags are the flags that take a value, as clap spells them.
var valueFlags = map[string]bool{
	"port": true, "transport": true, "socket-dir": true, "unix-socket": true,
	"connection-file": true, "idle-shutdown-hours": true, "token": true,
	"log-file": true, "log-level": true, "resource-sample-interval": true,
}

// parseArgs parses args as clap does for kcserver: long flags as
// "--name value" or "--name=value", -h/--help and -V/--version; anything
// else (an unknown flag, a single-dash long flag, a positional argument)
// is an error, which main turns into exit status 2.
func parseArgs(args []string) (options, error) {
	o := options{idleHours: -1}
	vals := map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch a {
		case "-h", "--help":
			o.help = true
			continue
		case "-V", "--version":
			o.version = true
			continue
		}
		name, ok := strings.CutPrefix(a, "--")
		if !ok || name == "" {
			return o, fmt.Errorf("unexpected argument '%s' found", a)
		}
		name, val, hasVal := strings.Cut(name, "=")
		if !valueFlags[name] {
			return o, fmt.Errorf("unexpected argument '--%s' found", name)
		}
		if _, dup := vals[name]; dup {
			return o, fmt.Errorf("the argument '--%s <%s>' cannot be used multiple times", name, strings.ToUpper(name))
		}
		if !hasVal {
			if i+1 >= len(args) {
				return o, fmt.Errorf("a value is required for '--%s <%s>' but none was supplied", name, strings.ToUpper(name))
			}
			i++
			val = args[i]
		}
		vals[name] = val
	}
	var err error
	num := func(name string, dst *int) {
		v, ok := vals[name]
		if !ok || err != nil {
			return
		}
		n, e := strconv.ParseUint(v, 10, 32)
		if e != nil {
			err = fmt.Errorf("invalid value '%s' for '--%s <%s>': invalid digit found in string", v, name, strings.ToUpper(name))
			return
		}
		*dst = int(n)
	}
	num("port", &o.port)
	num("idle-shutdown-hours", &o.idleHours)
	num("resource-sample-interval", &o.sampleInterval)
	if err != nil {
		return o, err
	}
	o.socketDir, o.unixSocket, o.connectionFile = vals["socket-dir"], vals["unix-socket"], vals["connection-file"]
	o.token, o.logFile, o.logLevel = vals["token"], vals["log-file"], vals["log-level"]
	switch t, ok := vals["transport"]; {
	case !ok && o.connectionFile != "":
		o.transport = "socket"
	case !ok:
		o.transport = "tcp"
	case t == "tcp", t == "socket", t == "named-pipe":
		o.transport = t
	default:
		return o, fmt.Errorf("invalid value '%s' for '--transport <TRANSPORT>'\n  [possible values: tcp, socket, named-pipe]", t)
	}
	return o, nil
}
