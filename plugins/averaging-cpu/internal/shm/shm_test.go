package shm

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// TestSharedSegment: ranks opening one segment at once all map the same
// file; it stays while any holds it and goes with the last.
func TestSharedSegment(t *testing.T) {
	dir := t.TempDir()
	const n = 8
	regs := make([]*Region, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range regs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			regs[i], errs[i] = OpenShared(dir, "seg", 4096)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
	}
	regs[0].Bytes()[100] = 42
	for i, r := range regs {
		if r.Bytes()[100] != 42 {
			t.Fatalf("region %d does not share the file", i)
		}
	}
	for i, r := range regs[:n-1] {
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(dir, "seg")); err != nil {
			t.Fatalf("segment gone after %d of %d closed: %v", i+1, n, err)
		}
	}
	regs[n-1].Close()
	if _, err := os.Stat(filepath.Join(dir, "seg")); !os.IsNotExist(err) {
		t.Fatalf("segment left behind: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("files left behind: %v", ents)
	}
	// A stale file of another size is refused.
	os.WriteFile(filepath.Join(dir, "old"), make([]byte, 10), 0o600)
	if _, err := OpenShared(dir, "old", 4096); err == nil || !strings.Contains(err.Error(), "holds 10 bytes") {
		t.Fatalf("stale segment: %v", err)
	}
}

func TestMapPeer(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "arena")
	os.WriteFile(p, make([]byte, 8192), 0o600)
	dev, ino, err := FileID(p)
	if err != nil {
		t.Fatal(err)
	}
	r, err := MapPeer(p, dev, ino, 8192)
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	if _, err := MapPeer(p, dev, ino+1, 8192); err == nil || !strings.Contains(err.Error(), "not the file") {
		t.Fatalf("wrong inode: %v", err)
	}
	if _, err := MapPeer(p, dev, ino, 1<<20); err == nil || !strings.Contains(err.Error(), "holds") {
		t.Fatalf("short file: %v", err)
	}
	if _, err := MapPeer(dir, dev, ino, 1); err == nil {
		t.Fatal("mapped a directory")
	}
}
