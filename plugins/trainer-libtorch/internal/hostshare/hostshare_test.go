package hostshare

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
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

// TestOneCopyAcrossProcesses: processes that acquire one key map one
// memfd, built by exactly one of them.
func TestOneCopyAcrossProcesses(t *testing.T) {
	key := uniqueKey(t)
	const procs = 4
	type result struct {
		built bool
		file  string
	}
	results := make([]result, procs)
	var stdins []io.WriteCloser
	var cmds []*exec.Cmd
	defer func() {
		for _, in := range stdins {
			in.Close()
		}
		for _, c := range cmds {
			c.Wait()
		}
	}()
	outs := make([]*bufio.Reader, procs)
	for i := range procs {
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
		stdins, cmds, outs[i] = append(stdins, in), append(cmds, c), bufio.NewReader(out)
	}
	for i := range procs {
		line, err := outs[i].ReadString('\n')
		if err != nil {
			t.Fatalf("process %d: %v", i, err)
		}
		var r result
		if _, err := fmt.Sscanf(line, "%t %s", &r.built, &r.file); err != nil {
			t.Fatalf("process %d printed %q: %v", i, line, err)
		}
		results[i] = r
	}
	builders := 0
	for i, r := range results {
		if r.built {
			builders++
		}
		if r.file != results[0].file {
			t.Errorf("process %d maps %s, process 0 %s", i, r.file, results[0].file)
		}
	}
	if builders != 1 {
		t.Errorf("%d processes built the block, want 1: %+v", builders, results)
	}
}

// TestOneBuildInProcess: concurrent acquirers get one build and the same
// contents; after the builder closes, the next acquirer builds anew while
// the old mappings stay readable.
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
	if err := builder.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := Acquire(context.Background(), key, pattern(100, &builds))
	if err != nil || !again.Built || len(again.Map.Bytes()) != 100 {
		t.Fatalf("after the builder closed: %+v %v", again, err)
	}
	defer again.Close()
	for _, img := range imgs {
		if err := checkPattern(img.Map.Bytes()); err != nil {
			t.Fatalf("an old mapping after its builder closed: %v", err)
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
		t.Fatalf("the waiting acquirer: %+v %v", second, secondErr)
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
		t.Fatalf("%+v %v", img, err)
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
