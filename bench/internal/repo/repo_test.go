package repo

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Peer finds the kit beside the repository, beside the main checkout of a
// worktree, and beside the checkout a clone comes from; elsewhere it says
// where it looked.
func TestPeer(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatal("git is needed:", err)
	}
	base := t.TempDir()
	git := func(dir string, args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@t"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	// base/kit/main is a checkout with the kit at base/kit/shared/peers.
	main := filepath.Join(base, "kit", "main")
	if err := os.MkdirAll(filepath.Join(base, "kit", "shared", "peers"), 0o755); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(base, "kit", "shared", "peers", "ddp_fashion_mnist.py")
	if err := os.WriteFile(want, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(main, 0o755); err != nil {
		t.Fatal(err)
	}
	git(main, "init", "-q")
	git(main, "commit", "-q", "--allow-empty", "-m", "start")
	worktree := filepath.Join(base, "trees", "wip")
	git(main, "worktree", "add", "-q", "-b", "wip", worktree)
	clone := filepath.Join(base, "elsewhere", "clone")
	git(base, "clone", "-q", main, clone)
	cloneOfWorktree := filepath.Join(base, "elsewhere", "clone2")
	git(base, "clone", "-q", worktree, cloneOfWorktree)
	lone := filepath.Join(base, "lone")
	if err := os.MkdirAll(lone, 0o755); err != nil {
		t.Fatal(err)
	}
	git(lone, "init", "-q")

	for _, tc := range []struct {
		name, root string
		ok         bool
	}{
		{"the main checkout", main, true},
		{"a worktree", worktree, true},
		{"a clone", clone, true},
		{"a clone of a worktree", cloneOfWorktree, true},
		{"a repository with no kit", lone, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DDPPeer(tc.root)
			if !tc.ok {
				if err == nil || !strings.Contains(err.Error(), filepath.Join(base, "shared", "peers", "ddp_fashion_mnist.py")) {
					t.Fatalf("DDPPeer = %q, %v; want an error naming where it looked", got, err)
				}
				return
			}
			if err != nil || got != want {
				t.Fatalf("DDPPeer = %q, %v; want %q", got, err, want)
			}
		})
	}
}
