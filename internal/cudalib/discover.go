package cudalib

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// Options is where to look beyond the host's usual places.
type Options struct {
	// NCCLPath, RuntimePath and BLASPath come from the plugin's settings
	// (nccl_library, cudart_library, cublas_library): a library file, or
	// a directory holding it. Empty: not set.
	NCCLPath    string
	RuntimePath string
	BLASPath    string
	// Getenv reads the environment; nil means os.Getenv.
	Getenv func(string) string
	// Root is prepended to the fixed system and python locations, so a
	// test can stand a tree of its own in for /; empty means /. Paths
	// from settings and the environment are taken as they are.
	Root string
}

// Candidate is one place a library was looked for.
type Candidate struct {
	// Path is a file to dlopen; a bare soname, which dlopen resolves by
	// the dynamic loader's own search; or, where a python location
	// matched nothing, the glob pattern that was tried.
	Path string
	// From says which rule produced it, e.g. "setting nccl_library",
	// "COHORT_NCCL_LIBRARY", "LD_LIBRARY_PATH", "system",
	// "dynamic loader", "python site-packages".
	From string
}

// systemDirs are where distribution packages and the CUDA toolkit put the
// libraries.
func systemDirs() []string {
	dirs := []string{}
	switch runtime.GOARCH {
	case "amd64":
		dirs = append(dirs, "/usr/lib/x86_64-linux-gnu")
	case "arm64":
		dirs = append(dirs, "/usr/lib/aarch64-linux-gnu")
	}
	return append(dirs, "/usr/local/cuda/lib64", "/usr/lib64", "/usr/lib", "/usr/local/lib")
}

// Candidates lists, in the order OpenNCCL, OpenRuntime and OpenBLAS try them, the
// places lib is looked for:
//
//  1. the settings path (Options.NCCLPath, RuntimePath or BLASPath);
//  2. the environment: COHORT_NCCL_LIBRARY, COHORT_CUDART_LIBRARY or
//     COHORT_CUBLAS_LIBRARY (a file or a directory), then each directory
//     of LD_LIBRARY_PATH;
//  3. the system directories, then the bare soname for the dynamic
//     loader (ld.so.cache, its built-in paths);
//  4. the libraries pip wheels such as PyTorch's install beside it,
//     <site-packages>/nvidia/*/lib/, in the site-packages of
//     $VIRTUAL_ENV, $CONDA_PREFIX, ~/.local/lib/python3*,
//     /usr/local/lib/python3* and /usr/lib/python3*, found by globbing
//     (no python runs). That is python's own precedence: an active
//     environment first, the user's packages before the system's.
//
// Within each place the sonames go newest first (libcudart.so.13 before
// .12), so an explicit place beats a newer version elsewhere. A path
// appearing twice is kept at its first place. Only the explicit paths are
// looked at on disk here (to tell a file from a directory) and the python
// globs expanded; whether a file exists is found out by loading it.
func Candidates(lib Library, o Options) []Candidate {
	s := lib.spec()
	getenv := o.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	root := o.Root
	if root == "" {
		root = "/"
	}
	var out []Candidate
	seen := map[string]bool{}
	add := func(path, from string) {
		if !seen[path] {
			seen[path] = true
			out = append(out, Candidate{Path: path, From: from})
		}
	}
	inDir := func(dir, from string) {
		for _, so := range s.sonames {
			add(filepath.Join(dir, so), from)
		}
	}
	// explicit is a file, or a directory to look in; a path that is
	// neither is kept as given so the error says it was not found.
	explicit := func(path, from string) {
		if path == "" {
			return
		}
		path = filepath.Clean(path)
		if fi, err := os.Stat(path); err == nil && fi.IsDir() {
			inDir(path, from)
			return
		}
		add(path, from)
	}

	settingPath := o.NCCLPath
	switch lib {
	case LibRuntime:
		settingPath = o.RuntimePath
	case LibBLAS:
		settingPath = o.BLASPath
	}
	explicit(settingPath, "setting "+s.setting)
	explicit(getenv(s.env), s.env)
	for _, dir := range strings.Split(getenv("LD_LIBRARY_PATH"), ":") {
		// An empty element means the working directory to ld.so; a
		// plugin's working directory is no place to pick a library from.
		if dir != "" {
			inDir(filepath.Clean(dir), "LD_LIBRARY_PATH")
		}
	}
	for _, dir := range systemDirs() {
		inDir(filepath.Join(root, dir), "system")
	}
	for _, so := range s.sonames {
		add(so, "dynamic loader")
	}

	var sitePatterns []string
	for _, env := range []string{"VIRTUAL_ENV", "CONDA_PREFIX"} {
		if prefix := getenv(env); prefix != "" {
			sitePatterns = append(sitePatterns, filepath.Join(prefix, "lib/python3*/site-packages"))
		}
	}
	if home := getenv("HOME"); home != "" {
		sitePatterns = append(sitePatterns, filepath.Join(home, ".local/lib/python3*/site-packages"))
	}
	for _, p := range []string{
		"/usr/local/lib/python3*/site-packages",
		"/usr/local/lib/python3*/dist-packages",
		"/usr/lib/python3*/dist-packages",
	} {
		sitePatterns = append(sitePatterns, filepath.Join(root, p))
	}
	for _, pattern := range sitePatterns {
		// Glob fails only on a malformed pattern (a prefix from the
		// environment with a stray '['): that matches nothing, and the
		// pattern recorded below shows it.
		sites, _ := filepath.Glob(pattern)
		if len(sites) == 0 {
			sites = []string{pattern}
		}
		for _, site := range sites {
			for _, so := range s.sonames {
				libPattern := filepath.Join(site, "nvidia/*/lib", so)
				files, _ := filepath.Glob(libPattern)
				if len(files) == 0 {
					files = []string{libPattern}
				}
				for _, f := range files {
					add(f, "python site-packages")
				}
			}
		}
	}
	return out
}
