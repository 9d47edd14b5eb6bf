package hostshare

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// seals are what a block must carry before a process maps it: no write,
// no resize, no change of the seals.
const seals = unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE

// waitBuild bounds how long a process waits for another to build a block
// when its context has no deadline: a data set of many gigabytes decodes
// for minutes.
const waitBuild = 30 * time.Minute

// attempts bounds how often Acquire starts over when a builder went away
// before it handed the block on.
const attempts = 5

// Image is a block this process holds: built here and served to the
// host's other processes until Close, or received from the process that
// built it.
type Image struct {
	// Map is the block, read-only.
	Map *Mapping
	// Built says this process built the block (and serves it).
	Built bool

	ln   *net.UnixListener
	fd   int
	done chan struct{}
	once sync.Once
}

// Acquire returns the block that key names for this user on this host:
// mapped from the process that built it, or built with build and served
// from here on. key is part of the socket's name: letters, digits, '-'.
func Acquire(ctx context.Context, key string, build Builder) (*Image, error) {
	addr := &net.UnixAddr{Name: fmt.Sprintf("@cohort-hostshare-%d-%s", os.Getuid(), key), Net: "unix"}
	var last error
	for range attempts {
		ln, err := net.ListenUnix("unix", addr)
		if err == nil {
			return serve(ln, build)
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("hostshare: listen on %s: %w", addr.Name, err)
		}
		img, err := fetch(ctx, addr)
		if err == nil {
			return img, nil
		}
		if !errors.Is(err, errGone) {
			return nil, err
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("hostshare: %s: %w", addr.Name, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil, fmt.Errorf("hostshare: %s: %d attempts: %w", addr.Name, attempts, last)
}

// serve builds the block into a sealed memfd, maps it read-only and
// hands its descriptor to every process that connects to ln, until Close.
// Processes that connected while it built wait in ln's backlog.
func serve(ln *net.UnixListener, build Builder) (*Image, error) {
	size, fill, err := build()
	if err != nil {
		ln.Close()
		return nil, &BuildError{err}
	}
	fd, err := makeBlock(size, fill)
	if err != nil {
		ln.Close()
		return nil, err
	}
	m, err := mapBlock(fd, size)
	if err != nil {
		unix.Close(fd)
		ln.Close()
		return nil, err
	}
	img := &Image{Map: m, Built: true, ln: ln, fd: fd, done: make(chan struct{})}
	go img.accept()
	return img, nil
}

// makeBlock creates a memfd of size bytes, reserves its memory (so that a
// host out of memory is an error here, not a SIGBUS while filling), fills
// it through a writable mapping and seals it.
func makeBlock(size int, fill func([]byte)) (fd int, err error) {
	if size <= 0 || size > MaxSize {
		return -1, fmt.Errorf("hostshare: a block of %d bytes", size)
	}
	fd, err = unix.MemfdCreate("cohort-hostshare", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, fmt.Errorf("hostshare: memfd_create: %w", err)
	}
	fail := func(err error) (int, error) {
		unix.Close(fd)
		return -1, err
	}
	if err := unix.Fallocate(fd, 0, 0, int64(size)); err != nil {
		return fail(fmt.Errorf("hostshare: reserve %d bytes of shared memory: %w", size, err))
	}
	b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail(fmt.Errorf("hostshare: map %d bytes to fill: %w", size, err))
	}
	fill(b)
	// F_SEAL_WRITE is refused while a writable shared mapping exists.
	if err := unix.Munmap(b); err != nil {
		return fail(fmt.Errorf("hostshare: unmap after filling: %w", err))
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		return fail(fmt.Errorf("hostshare: seal: %w", err))
	}
	return fd, nil
}

// mapBlock maps fd's size bytes read-only; the Mapping unmaps them once
// unreachable.
func mapBlock(fd, size int) (*Mapping, error) {
	// Populated now: the pages exist already, and faulting them in one by
	// one would fall on the training's first epoch.
	b, err := unix.Mmap(fd, 0, size, unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("hostshare: map %d bytes: %w", size, err)
	}
	m := &Mapping{b: b}
	runtime.AddCleanup(m, func(b []byte) { unix.Munmap(b) }, b)
	return m, nil
}

// accept hands the descriptor to each process of this user that connects,
// until Close closes the listener.
func (img *Image) accept() {
	defer close(img.done)
	for {
		c, err := img.ln.AcceptUnix()
		if err != nil {
			return
		}
		img.handOver(c)
	}
}

// handOver sends the descriptor on c when its peer runs as this user.
func (img *Image) handOver(c *net.UnixConn) {
	defer c.Close()
	if uid, err := peerUID(c); err != nil || uid != os.Getuid() {
		return
	}
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	c.WriteMsgUnix([]byte{1}, unix.UnixRights(img.fd), nil)
}

// Close stops serving the block (a process that connects later builds its
// own) and waits for the server to stop. The mapping stays until nothing
// refers to Map any more.
func (img *Image) Close() error {
	if !img.Built {
		return nil
	}
	var err error
	img.once.Do(func() {
		err = img.ln.Close()
		<-img.done
		err = errors.Join(err, unix.Close(img.fd))
	})
	return err
}

// errGone says the builder went away before it handed the block on (it
// failed, or it closed): the caller starts over.
var errGone = errors.New("the process serving the block went away")

// fetch receives the block from the process serving addr and maps it.
func fetch(ctx context.Context, addr *net.UnixAddr) (*Image, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", addr.String())
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("%w: %w", errGone, err)
		}
		return nil, fmt.Errorf("hostshare: connect to %s: %w", addr.Name, err)
	}
	c := conn.(*net.UnixConn)
	defer c.Close()
	if uid, err := peerUID(c); err != nil {
		return nil, fmt.Errorf("hostshare: %s: %w", addr.Name, err)
	} else if uid != os.Getuid() {
		return nil, fmt.Errorf("hostshare: %s is served by user %d, not this user (%d)", addr.Name, uid, os.Getuid())
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(waitBuild)
	}
	c.SetReadDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { c.SetReadDeadline(time.Now()) })
	defer stop()

	var buf [1]byte
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf[:], oob)
	fds := receivedFDs(oob[:oobn])
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	switch {
	case ctx.Err() != nil:
		return nil, fmt.Errorf("hostshare: wait for %s: %w", addr.Name, ctx.Err())
	case errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || (err == nil && n == 0):
		return nil, errGone
	case err != nil:
		return nil, fmt.Errorf("hostshare: receive from %s: %w", addr.Name, err)
	case flags&unix.MSG_CTRUNC != 0 || len(fds) != 1:
		return nil, fmt.Errorf("hostshare: %s sent %d descriptors, want 1", addr.Name, len(fds))
	}
	fd := fds[0]
	got, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || got&seals != seals {
		return nil, fmt.Errorf("hostshare: the block from %s is not sealed (seals %#x, %v)", addr.Name, got, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("hostshare: the block from %s: %w", addr.Name, err)
	}
	if st.Size <= 0 || st.Size > MaxSize {
		return nil, fmt.Errorf("hostshare: the block from %s holds %d bytes", addr.Name, st.Size)
	}
	m, err := mapBlock(fd, int(st.Size))
	if err != nil {
		return nil, err
	}
	return &Image{Map: m}, nil
}

// receivedFDs are the descriptors in a message's control data.
func receivedFDs(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for i := range msgs {
		if got, err := unix.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, got...)
		}
	}
	return fds
}

// peerUID is the user of the process at the other end of c.
func peerUID(c *net.UnixConn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, fmt.Errorf("peer credentials: %w", cerr)
	}
	return int(cred.Uid), nil
}
