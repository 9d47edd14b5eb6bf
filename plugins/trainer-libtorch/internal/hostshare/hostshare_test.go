package hostshare

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

// childEnv, set, makes the test binary a process that acquires the block
// it names, prints "<built> <device:inode>" of its mapping, and holds it
// until its stdin closes.
const childEnv = "HOSTSHARE_TEST_CHILD"

func TestMain(m *testing.M) {
	if key := os.Getenv(childEnv); key != "" {
		os.Exit(child(key))
	}
	os.Exit(m.Run())
}

func child(key string) int {
	img, err := Acquire(context.Background(), key, pattern(1<<20, nil))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := checkPattern(img.Map.Bytes()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	file, err := mappedFile(img.Map.Bytes())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("%v %s\n", img.Built, file)
	os.Stdin.Read(make([]byte, 1)) // until the parent closes it
	img.Close()
	return 0
}

// uniqueKey is a block key no other test (or test process) uses.
func uniqueKey(t testing.TB) string {
	var b [8]byte
	rand.Read(b[:])
	return strings.ReplaceAll(t.Name(), "/", "-") + "-" + hex.EncodeToString(b[:])
}

// pattern is a Builder of size bytes, byte i being i*7 mod 251; builds
// counts its calls.
func pattern(size int, builds *atomic.Int32) Builder {
	return func() (int, func([]byte), error) {
		if builds != nil {
			builds.Add(1)
		}
		return size, func(dst []byte) {
			for i := range dst {
				dst[i] = byte(i * 7 % 251)
			}
		}, nil
	}
}

func checkPattern(b []byte) error {
	for i, v := range b {
		if v != byte(i*7%251) {
			return fmt.Errorf("byte %d of %d is %d, want %d", i, len(b), v, byte(i*7%251))
		}
	}
	return nil
}

// mappedFile is the "device inode" of the file mapped at b, from
// /proc/self/maps.
func mappedFile(b []byte) (string, error) {
	addr := uint64(uintptr(unsafe.Pointer(&b[0])))
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 6 {
			continue
		}
		lo, hi, _ := strings.Cut(fs[0], "-")
		l, _ := strconv.ParseUint(lo, 16, 64)
		h, _ := strconv.ParseUint(hi, 16, 64)
		if addr >= l && addr < h {
			if !strings.Contains(fs[5], "memfd:cohort-hostshare") || !strings.HasPrefix(fs[1], "r--s") {
				return "", fmt.Errorf("the block is mapped as %q", sc.Text())
			}
			return fs[3] + ":" + fs[4], nil
		}
	}
	return "", fmt.Errorf("no mapping holds %#x", addr)
}

// holder is a child process that holds the block.
type holder struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	built bool
	file  string // the mapped memfd's "device inode"
}

// startHolder starts a child that acquires key and waits until it holds
// the block; it is stopped at the test's end.
func startHolder(t *testing.T, key string) *holder {
	t.Helper()
	c := exec.Command(os.Args[0], "-test.run=^$")
	c.Env = append(os.Environ(), childEnv+"="+key)
	c.Stderr = os.Stderr
	in, err := c.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	h := &holder{cmd: c, in: in}
	t.Cleanup(func() {
		in.Close()
		c.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("holder: %v", err)
	}
	if _, err := fmt.Sscanf(line, "%t %s", &h.built, &h.file); err != nil {
		t.Fatalf("holder printed %q: %v", line, err)
	}
	return h
}

// waitServed waits until a process serves key's block again, after its
// server went: the others take over as soon as they see it go.
func waitServed(t *testing.T, key string) {
	t.Helper()
	addr := fmt.Sprintf("@cohort-hostshare-%d-%s", os.Getuid(), key)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if c, err := net.Dial("unix", addr); err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no process took over serving the block")
		}
	}
}

// TestOneCopyAcrossProcesses: processes that acquire one key map one
// memfd, built by exactly one of them; when the builder is killed, one of
// the others serves it, and a process that comes later maps it too.
func TestOneCopyAcrossProcesses(t *testing.T) {
	key := uniqueKey(t)
	const procs = 4
	var hs []*holder
	var wg sync.WaitGroup
	var mu sync.Mutex
	for range procs {
		wg.Go(func() {
			h := startHolder(t, key)
			mu.Lock()
			hs = append(hs, h)
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(hs) != procs {
		t.FailNow()
	}
	var builder *holder
	for _, h := range hs {
		if h.built {
			if builder != nil {
				t.Fatalf("two processes built the block: %+v %+v", builder, h)
			}
			builder = h
		}
		if h.file != hs[0].file {
			t.Errorf("one process maps %s, another %s", h.file, hs[0].file)
		}
	}
	if builder == nil {
		t.Fatal("no process built the block")
	}

	builder.cmd.Process.Kill()
	builder.cmd.Wait()
	waitServed(t, key)
	late := startHolder(t, key)
	if late.built || late.file != hs[0].file {
		t.Errorf("after the builder died a new process built %v and maps %s, want the others' %s", late.built, late.file, hs[0].file)
	}
}

// TestOneBuildInProcess: concurrent acquirers get one build and the same
// contents; after the builder closes another holder serves the block, and
// only once every holder has closed does the next acquirer build anew,
// while the old mappings stay readable.
func TestOneBuildInProcess(t *testing.T) {
	key := uniqueKey(t)
	var builds atomic.Int32
	const n = 6
	imgs := make([]*Image, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { imgs[i], errs[i] = Acquire(context.Background(), key, pattern(3*4096+5, &builds)) })
	}
	wg.Wait()
	var builder *Image
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if err := checkPattern(imgs[i].Map.Bytes()); err != nil {
			t.Fatal(err)
		}
		if imgs[i].Built {
			builder = imgs[i]
		}
	}
	if builds.Load() != 1 || builder == nil {
		t.Fatalf("%d builds for %d acquirers", builds.Load(), n)
	}
	// The builder closes: another holder serves the block.
	if err := builder.Close(); err != nil {
		t.Fatal(err)
	}
	waitServed(t, key)
	again, err := Acquire(context.Background(), key, pattern(100, &builds))
	if err != nil || again.Built || checkPattern(again.Map.Bytes()) != nil {
		t.Fatalf("after the builder closed: %v (built %v)", err, again != nil && again.Built)
	}
	// Every holder closes: the next one to ask builds anew, while the old
	// mappings stay readable.
	for _, img := range append(imgs, again) {
		if err := img.Close(); err != nil {
			t.Fatal(err)
		}
	}
	fresh, err := Acquire(context.Background(), key, pattern(100, &builds))
	if err != nil || !fresh.Built || len(fresh.Map.Bytes()) != 100 || builds.Load() != 2 {
		t.Fatalf("after every holder closed: %v, %d builds", err, builds.Load())
	}
	fresh.Close()
	for _, img := range imgs {
		if err := checkPattern(img.Map.Bytes()); err != nil {
			t.Fatalf("an old mapping after its image closed: %v", err)
		}
	}
}

// TestFailedBuild: the builder's error comes back as a BuildError, and a
// process waiting on that builder builds the block itself.
func TestFailedBuild(t *testing.T) {
	key := uniqueKey(t)
	bad := errors.New("bad data")
	started, fail := make(chan struct{}), make(chan struct{})
	var firstErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		_, firstErr = Acquire(context.Background(), key, func() (int, func([]byte), error) {
			close(started)
			<-fail
			return 0, nil, bad
		})
	})
	<-started
	var second *Image
	var secondErr error
	wg.Go(func() { second, secondErr = Acquire(context.Background(), key, pattern(4096, nil)) })
	close(fail)
	wg.Wait()
	var be *BuildError
	if !errors.As(firstErr, &be) || !errors.Is(firstErr, bad) {
		t.Fatalf("the failed build returned %v, want a BuildError of %v", firstErr, bad)
	}
	if secondErr != nil || !second.Built || checkPattern(second.Map.Bytes()) != nil {
		t.Fatalf("the waiting acquirer: %v", secondErr)
	}
	second.Close()
}

// TestRefusedSizes: a builder's size outside 1..MaxSize is an error, and
// the name is free again afterwards.
func TestRefusedSizes(t *testing.T) {
	key := uniqueKey(t)
	for _, size := range []int{0, -1, MaxSize + 1} {
		if img, err := Acquire(context.Background(), key, pattern(size, nil)); err == nil {
			img.Close()
			t.Errorf("a block of %d bytes accepted", size)
		}
	}
	img, err := Acquire(context.Background(), key, pattern(10, nil))
	if err != nil || !img.Built {
		t.Fatalf("a block of 10 bytes after refused ones: %v", err)
	}
	img.Close()
}

// TestWaitEndsWithContext: a process waiting for a builder gives up when
// its context ends.
func TestWaitEndsWithContext(t *testing.T) {
	key := uniqueKey(t)
	started, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	var builder *Image
	wg.Go(func() {
		builder, _ = Acquire(context.Background(), key, func() (int, func([]byte), error) {
			close(started)
			<-release
			return 10, func([]byte) {}, nil
		})
	})
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := Acquire(ctx, key, pattern(10, nil))
		done <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled wait returned %v", err)
	}
	close(release)
	wg.Wait()
	if builder != nil {
		builder.Close()
	}
}
