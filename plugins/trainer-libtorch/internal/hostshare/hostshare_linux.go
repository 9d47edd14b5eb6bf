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

// Image is a block this process holds. Whoever holds one serves it to the
// host's other processes in turn: the builder first, and when the process
// serving it goes (it closed, or died), one of those that received it from
// there takes the name over, so the one copy lives on as long as any
// process holds it.
type Image struct {
	// Map is the block, read-only.
	Map *Mapping
	// Built says this process built the block.
	Built bool

	addr *net.UnixAddr
	fd   int // the memfd, to hand on
	// ctx ends with Close: it stops a takeover, and the wait for a
	// descriptor in one.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	stopped bool
	ln      *net.UnixListener // while this process serves the block
	watch   *net.UnixConn     // while another process does
	// peers are the connections of the processes this one handed the
	// block to: each watches its end to learn when this one goes.
	peers map[*net.UnixConn]struct{}
}

func newImage(addr *net.UnixAddr, m *Mapping, fd int, built bool) *Image {
	ctx, cancel := context.WithCancel(context.Background())
	return &Image{Map: m, Built: built, addr: addr, fd: fd, ctx: ctx, cancel: cancel, peers: map[*net.UnixConn]struct{}{}}
}

// Acquire returns the block that key names for this user on this host:
// mapped from the process that serves it, or built with build and served
// from here on. key is part of the socket's name: letters, digits, '-'.
func Acquire(ctx context.Context, key string, build Builder) (*Image, error) {
	addr := &net.UnixAddr{Name: fmt.Sprintf("@cohort-hostshare-%d-%s", os.Getuid(), key), Net: "unix"}
	var last error
	for range attempts {
		ln, err := net.ListenUnix("unix", addr)
		if err == nil {
			return serve(addr, ln, build)
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("hostshare: listen on %s: %w", addr.Name, err)
		}
		c, fd, err := fetch(ctx, addr)
		if err == nil {
			return follow(addr, c, fd)
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
func serve(addr *net.UnixAddr, ln *net.UnixListener, build Builder) (*Image, error) {
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
	img := newImage(addr, m, fd, true)
	img.ln = ln
	img.wg.Go(func() { img.accept(ln) })
	return img, nil
}

// follow maps the block fetch received on c and watches c: when the
// serving process goes, this one takes over.
func follow(addr *net.UnixAddr, c *net.UnixConn, fd int) (*Image, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		c.Close()
		unix.Close(fd)
		return nil, fmt.Errorf("hostshare: the block from %s: %w", addr.Name, err)
	}
	m, err := mapBlock(fd, int(st.Size))
	if err != nil {
		c.Close()
		unix.Close(fd)
		return nil, err
	}
	img := newImage(addr, m, fd, false)
	img.watch = c
	img.wg.Go(func() { img.takeOver(c) })
	return img, nil
}

// takeOver waits for the process serving the block on c to go, then
// serves it from here, or, where another process was quicker, watches
// that one. It returns when the image is closed.
func (img *Image) takeOver(c *net.UnixConn) {
	for {
		io.Copy(io.Discard, c) // until the server's end closes
		c.Close()
		for c = nil; c == nil; {
			if img.ctx.Err() != nil {
				return
			}
			if ln, err := net.ListenUnix("unix", img.addr); err == nil {
				if img.adopt(ln, nil) {
					img.accept(ln)
				}
				return
			}
			if next, fd, err := fetch(img.ctx, img.addr); err == nil {
				unix.Close(fd) // this process has the block already
				if !img.adopt(nil, next) {
					return
				}
				c = next
				break
			}
			select {
			case <-img.ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
}

// adopt records the listener or watched connection takeOver got; false,
// with it closed, once the image is closed.
func (img *Image) adopt(ln *net.UnixListener, c *net.UnixConn) bool {
	img.mu.Lock()
	defer img.mu.Unlock()
	if img.stopped {
		if ln != nil {
			ln.Close()
		}
		if c != nil {
			c.Close()
		}
		return false
	}
	img.ln, img.watch = ln, c
	return true
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

// accept hands the descriptor to each process of this user that connects
// to ln, until Close closes it.
func (img *Image) accept(ln *net.UnixListener) {
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		img.handOver(c)
	}
}

// handOver sends the descriptor on c when its peer runs as this user, and
// keeps c open: its peer learns from its close that this process went.
func (img *Image) handOver(c *net.UnixConn) {
	if uid, err := peerUID(c); err != nil || uid != os.Getuid() {
		c.Close()
		return
	}
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := c.WriteMsgUnix([]byte{1}, unix.UnixRights(img.fd), nil); err != nil {
		c.Close()
		return
	}
	img.mu.Lock()
	defer img.mu.Unlock()
	if img.stopped {
		c.Close()
		return
	}
	img.peers[c] = struct{}{}
	img.wg.Go(func() {
		io.Copy(io.Discard, c) // until the peer goes or Close closes c
		img.mu.Lock()
		delete(img.peers, c)
		img.mu.Unlock()
		c.Close()
	})
}

// Close stops serving or watching the block and waits for that to stop;
// another process that holds the block takes over serving it. The mapping
// stays until nothing refers to Map any more.
func (img *Image) Close() error {
	img.mu.Lock()
	if img.stopped {
		img.mu.Unlock()
		return nil
	}
	img.stopped = true
	img.cancel()
	var errs []error
	if img.ln != nil {
		errs = append(errs, img.ln.Close())
	}
	if img.watch != nil {
		img.watch.Close()
	}
	for c := range img.peers {
		c.Close()
	}
	img.mu.Unlock()
	img.wg.Wait()
	return errors.Join(append(errs, unix.Close(img.fd))...)
}

// errGone says the builder went away before it handed the block on (it
// failed, or it closed): the caller starts over.
var errGone = errors.New("the process serving the block went away")

// fetch receives the block's descriptor from the process serving addr,
// checked to be sealed and of a size this process maps, and returns it
// with the connection, which stays open.
func fetch(ctx context.Context, addr *net.UnixAddr) (*net.UnixConn, int, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", addr.String())
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil, -1, fmt.Errorf("%w: %w", errGone, err)
		}
		return nil, -1, fmt.Errorf("hostshare: connect to %s: %w", addr.Name, err)
	}
	c := conn.(*net.UnixConn)
	fd, err := receive(ctx, c, addr)
	if err != nil {
		c.Close()
		return nil, -1, err
	}
	c.SetReadDeadline(time.Time{})
	return c, fd, nil
}

// receive reads the descriptor from c and checks it.
func receive(ctx context.Context, c *net.UnixConn, addr *net.UnixAddr) (int, error) {
	if uid, err := peerUID(c); err != nil {
		return -1, fmt.Errorf("hostshare: %s: %w", addr.Name, err)
	} else if uid != os.Getuid() {
		return -1, fmt.Errorf("hostshare: %s is served by user %d, not this user (%d)", addr.Name, uid, os.Getuid())
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
	keep := -1
	defer func() {
		for _, fd := range fds {
			if fd != keep {
				unix.Close(fd)
			}
		}
	}()
	switch {
	case ctx.Err() != nil:
		return -1, fmt.Errorf("hostshare: wait for %s: %w", addr.Name, ctx.Err())
	case errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || (err == nil && n == 0):
		return -1, errGone
	case err != nil:
		return -1, fmt.Errorf("hostshare: receive from %s: %w", addr.Name, err)
	case flags&unix.MSG_CTRUNC != 0 || len(fds) != 1:
		return -1, fmt.Errorf("hostshare: %s sent %d descriptors, want 1", addr.Name, len(fds))
	}
	fd := fds[0]
	got, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || got&seals != seals {
		return -1, fmt.Errorf("hostshare: the block from %s is not sealed (seals %#x, %v)", addr.Name, got, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return -1, fmt.Errorf("hostshare: the block from %s: %w", addr.Name, err)
	}
	if st.Size <= 0 || st.Size > MaxSize {
		return -1, fmt.Errorf("hostshare: the block from %s holds %d bytes", addr.Name, st.Size)
	}
	keep = fd
	return fd, nil
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
