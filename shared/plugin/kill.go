package plugin

import (
	"io/fs"
	"os"

	goplugin "github.com/hashicorp/go-plugin"
)

// Kill ends a plugin client as go-plugin's Client.Kill does (Shutdown
// first, then the process), and then removes the plugin's unix socket file
// when the plugin could not: a plugin that exits on its own closes and
// unlinks its socket, but one killed by a signal leaves it in the
// temporary directory, and its host is the only one left who knows the
// path. Hosts end every client with Kill rather than Client.Kill.
func Kill(c *goplugin.Client) {
	sock := socketPath(c)
	c.Kill()
	if sock == "" {
		return
	}
	// The plugin announced this path in its handshake and is gone now; it
	// is removed only while it still is a socket.
	if fi, err := os.Lstat(sock); err == nil && fi.Mode()&fs.ModeSocket != 0 {
		_ = os.Remove(sock) // nothing is left to tell of a failure
	}
}

// socketPath is the unix socket a started client talks to, or "".
func socketPath(c *goplugin.Client) string {
	rc := c.ReattachConfig()
	if rc == nil || rc.Addr == nil || rc.Addr.Network() != "unix" {
		return ""
	}
	return rc.Addr.String()
}
