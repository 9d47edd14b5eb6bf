package plugin

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
)

// The SDK is a Go module of its own, SDKModule, released as the tag
// shared/vX.Y.Z of cohort's repository: a vendor's go.mod requires
// SDKModule at vSDKVersion, without a replace. SDKVersion is the version
// this copy of the SDK is (or will be, until its tag is made), and the
// examples in the repository require it.
const (
	SDKModule  = "github.com/cohortdl/cohort/shared"
	SDKVersion = "0.1.0"
)

// ErrProtocol is wrapped by the error of a plugin that speaks no protocol
// version this host speaks.
var ErrProtocol = errors.New("no common cohort plugin protocol version")

// ProtocolError is a plugin refused at the handshake because it speaks no
// protocol version this host speaks.
type ProtocolError struct {
	// Plugin names the plugin, its binary's name.
	Plugin string
	// Speaks is the version the plugin offered; -1 when go-plugin's error
	// did not say.
	Speaks int
	// Err is go-plugin's own error.
	Err error
}

func (e *ProtocolError) Error() string {
	if e.Speaks < 0 {
		return fmt.Sprintf("plugin %s speaks no cohort plugin protocol this cohort speaks (%s): %v", e.Plugin, ProtocolRange(), e.Err)
	}
	return fmt.Sprintf("plugin %s speaks cohort plugin protocol %d; this cohort speaks %s", e.Plugin, e.Speaks, ProtocolRange())
}

// Unwrap gives ErrProtocol and go-plugin's error.
func (e *ProtocolError) Unwrap() []error { return []error{ErrProtocol, e.Err} }

// go-plugin's negotiation error, the only place the plugin's version shows:
// "incompatible API version with plugin. Plugin version: 3, Client
// versions: [1 2]".
var negotiationError = regexp.MustCompile(`(?i)incompatible API version with plugin\. Plugin version: (-?\d+)`)

// ExplainStart turns go-plugin's version negotiation error from starting
// the plugin binary named plugin into a *ProtocolError that names both
// sides' versions; any other error comes back as it is.
func ExplainStart(plugin string, err error) error {
	if err == nil {
		return nil
	}
	m := negotiationError.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	v, convErr := strconv.Atoi(m[1])
	if convErr != nil {
		v = -1
	}
	return &ProtocolError{Plugin: plugin, Speaks: v, Err: err}
}

// checkProtocols validates the versions a plugin asks to serve: known ones
// only, each once. None means every version this SDK speaks.
func checkProtocols(vs []int) ([]int, error) {
	if len(vs) == 0 {
		return Protocols(), nil
	}
	out := slices.Clone(vs)
	slices.Sort(out)
	for i, v := range out {
		if v < OldestProtocol || v > ProtocolVersion {
			return nil, fmt.Errorf("plugin.ServeOptions.Protocols: this SDK speaks cohort plugin protocol %s, not %d", ProtocolRange(), v)
		}
		if i > 0 && out[i-1] == v {
			return nil, fmt.Errorf("plugin.ServeOptions.Protocols: version %d twice", v)
		}
	}
	return out, nil
}
