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

// parentExit returns a function that waits until process ppid exits, or
// false where the kernel offers no pollable pidfd (before Linux 5.10). It
// waits in Go's poller on a pidfd, which turns readable when its process
// has exited: nothing wakes before that. A 300 ms getppid poll woke a quiet
// plugin's Go runtime three times a second, and each time its sysmon thread
// then polled every 20 µs for milliseconds, on cores that a rank's training
// threads fill. The function returns an error if it cannot wait after all.
func parentExit(ppid int) (func() error, bool) {
	fd, err := unix.PidfdOpen(ppid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, false
	}
	// Non-blocking, so os.NewFile hands it to the poller.
	f := os.NewFile(uintptr(fd), fmt.Sprintf("pidfd of process %d", ppid))
	return func() error {
		defer f.Close()
		rc, err := f.SyscallConn()
		if err != nil {
			return err
		}
		var exited bool
		// The callback runs before the first wait and after each
		// readiness; a pidfd polls readable once its process has exited.
		err = rc.Read(func(fd uintptr) bool {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, perr := unix.Poll(fds, 0)
			exited = perr == nil && n > 0
			return exited || perr != nil
		})
		if err == nil && !exited {
			err = fmt.Errorf("polling the pidfd of process %d failed", ppid)
		}
		return err
	}, true
}
