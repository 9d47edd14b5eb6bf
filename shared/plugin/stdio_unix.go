//go:build unix && !linux

package plugin

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// setParentDeathSignal does nothing where the kernel has no parent-death
// signal; Serve's getppid watch covers it.
func setParentDeathSignal() {}

// protectStdout keeps the stream on stdoutFD for the handshake alone; see
// the Linux version.
func protectStdout(stdoutFD, stderrFD int) (*os.File, error) {
	private, err := unix.FcntlInt(uintptr(stdoutFD), unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return nil, fmt.Errorf("duplicate fd %d: %w", stdoutFD, err)
	}
	if err := unix.Dup2(stderrFD, stdoutFD); err != nil {
		_ = unix.Close(private)
		return nil, fmt.Errorf("redirect fd %d to fd %d: %w", stdoutFD, stderrFD, err)
	}
	return os.NewFile(uintptr(private), "handshake-stdout"), nil
}

// parentExit has no pidfd to wait on here: Serve polls getppid instead.
func parentExit(int) (func() error, bool) { return nil, false }
