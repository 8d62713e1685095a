// Package hook implements kc-hook's stages: recording a container's init
// process when it is created, and reaping its supervisor trees when it
// stops.
package hook

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kc-watchman/kc-watchman/internal/containerid"
)

// ErrBadInput is returned (wrapped) for a State the hook cannot use.
var ErrBadInput = errors.New("unusable hook input")

// ErrUnknownStage is returned (wrapped) for a STAGE the hook does not know.
var ErrUnknownStage = errors.New("unknown stage")

// MaxInput bounds what the hook reads from stdin. A runtime-spec State is
// a few hundred bytes plus annotations.
const MaxInput = 1 << 20

// Stage is a hook stage the binary understands.
type Stage string

// Stages, named as in the runtime spec and oci-hooks(5).
const (
	StageCreateRuntime   Stage = "createRuntime"
	StageCreateContainer Stage = "createContainer"
	StageStartContainer  Stage = "startContainer"
	StagePoststart       Stage = "poststart"
	StagePoststop        Stage = "poststop"
)

// ParseStage maps a command-line stage to a Stage; "prestart" is the
// deprecated name of createRuntime.
func ParseStage(s string) (Stage, error) {
	switch s {
	case "prestart", string(StageCreateRuntime):
		return StageCreateRuntime, nil
	case string(StageCreateContainer), string(StageStartContainer), string(StagePoststart), string(StagePoststop):
		return Stage(s), nil
	}
	return "", fmt.Errorf("%w %q (want createRuntime, prestart, createContainer, startContainer, poststart or poststop)", ErrUnknownStage, s)
}

// ReadState decodes the runtime-spec State from r and checks what the hook
// relies on: a full container ID (which is also what makes it safe as a
// file name) and a non-negative pid.
func ReadState(r io.Reader) (*specs.State, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxInput+1))
	if err != nil {
		return nil, fmt.Errorf("%w: reading stdin: %v", ErrBadInput, err)
	}
	if len(data) > MaxInput {
		return nil, fmt.Errorf("%w: state on stdin is larger than %d bytes", ErrBadInput, MaxInput)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("%w: no container state on stdin", ErrBadInput)
	}
	var st specs.State
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&st); err != nil {
		return nil, fmt.Errorf("%w: state on stdin is not JSON: %v", ErrBadInput, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data after the state object", ErrBadInput)
	}
	if st.ID == "" {
		return nil, fmt.Errorf("%w: state has no container id", ErrBadInput)
	}
	if !containerid.Valid(st.ID) {
		return nil, fmt.Errorf("%w: container id %.80q is not 64 lowercase hex characters", ErrBadInput, st.ID)
	}
	if st.Pid < 0 {
		return nil, fmt.Errorf("%w: negative pid %d", ErrBadInput, st.Pid)
	}
	return &st, nil
}
