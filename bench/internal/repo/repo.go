// Package repo finds the cohort repository a benchmark runs in, so the
// benchmarks can name the peers beside it (../shared/peers, beside the
// checkout a worktree or clone comes from too) and its build outputs
// wherever they are started from.
package repo

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// Root is the directory holding go.mod, at or above the working directory.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the cohort repository (no go.mod above the working directory)")
		}
		dir = parent
	}
}

// Cohort is the cohort binary at path, made absolute, or an error saying
// how to get one.
func Cohort(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(abs); err != nil {
		return "", fmt.Errorf("no cohort binary: %w (run make build, or name it with -cohort)", err)
	}
	return abs, nil
}

// DDPPeer is the kit's DDP peer script, ddp_fashion_mnist.py (see Peer).
func DDPPeer(root string) (string, error) { return Peer(root, "ddp_fashion_mnist.py") }

// GlooPeer is the kit's gloo all-reduce script, gloo_allreduce.py (see
// Peer).
func GlooPeer(root string) (string, error) { return Peer(root, "gloo_allreduce.py") }

// Peer finds the kit's peer script name in ../shared/peers beside the
// repository at root, or, where root is a git worktree or a clone of a
// checkout on this machine, beside the checkout it comes from: the kit
// sits next to the main checkout, not next to every worktree or clone of
// it. The error lists where it looked.
func Peer(root, name string) (string, error) {
	var tried []string
	seen := map[string]bool{}
	for dir := root; dir != "" && !seen[dir] && len(tried) < 8; dir = origin(dir) {
		seen[dir] = true
		for _, d := range []string{dir, mainCheckout(dir)} {
			if d == "" {
				continue
			}
			p := filepath.Join(d, "..", "shared", "peers", name)
			if _, err := os.Stat(p); err == nil {
				return filepath.Clean(p), nil
			}
			tried = append(tried, filepath.Clean(p))
		}
	}
	return "", fmt.Errorf("no %s in %s (name it with -peer)", name, strings.Join(slices.Compact(tried), ", "))
}

// mainCheckout is the directory of the repository's main working tree when
// dir is a linked worktree of it (git's common directory is then another
// checkout's .git); "" otherwise.
func mainCheckout(dir string) string {
	common, err := gitOut(dir, "rev-parse", "--path-format=absolute", "--git-common-dir")
	if err != nil || filepath.Base(common) != ".git" {
		return ""
	}
	if main := filepath.Dir(common); main != filepath.Clean(dir) {
		return main
	}
	return ""
}

// origin is the checkout dir was cloned from, when its origin remote is a
// directory on this machine; "" otherwise.
func origin(dir string) string {
	url, err := gitOut(dir, "config", "--get", "remote.origin.url")
	if err != nil {
		return ""
	}
	url = strings.TrimPrefix(url, "file://")
	if !filepath.IsAbs(url) {
		return ""
	}
	url = strings.TrimSuffix(filepath.Clean(url), string(filepath.Separator)+".git")
	if fi, err := os.Stat(url); err != nil || !fi.IsDir() {
		return ""
	}
	return url
}

// gitOut runs git in dir and returns its trimmed output.
func gitOut(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s in %s: %w", strings.Join(args, " "), dir, err)
	}
	return strings.TrimSpace(string(out)), nil
}
