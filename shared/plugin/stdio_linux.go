package plugin

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// setParentDeathSignal asks the kernel to SIGKILL this process when the
// thread that forked it exits. It is a first line only: a Go host forks
// from whichever thread runs the goroutine, so Serve also watches getppid.
func setParentDeathSignal() {
	_ = unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0)
}

// protectStdout keeps the stream on stdoutFD for the handshake alone. It
// duplicates stdoutFD to a private close-on-exec descriptor, then makes
// stdoutFD a copy of stderrFD, so anything later written to stdoutFD (by
// Go, by C code, by children) lands on stderr. It returns the private
// descriptor as a file.
func protectStdout(stdoutFD, stderrFD int) (*os.File, error) {
	private, err := unix.FcntlInt(uintptr(stdoutFD), unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return nil, fmt.Errorf("duplicate fd %d: %w", stdoutFD, err)
	}
	if err := unix.Dup3(stderrFD, stdoutFD, 0); err != nil {
		_ = unix.Close(private)
		return nil, fmt.Errorf("redirect fd %d to fd %d: %w", stdoutFD, stderrFD, err)
	}
	return os.NewFile(uintptr(private), "handshake-stdout"), nil
}
