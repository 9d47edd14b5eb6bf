// Package launch starts trainer-pytorch's Python side: it finds an
// interpreter that has what the trainer needs (Find), packs the Python
// code into an in-memory zip the interpreter runs (Bundle), makes the TLS
// certificate go-plugin's AutoMTLS asks of the plugin (Cert) and replaces
// the launcher's process with the interpreter's (Exec), so the host's
// go-plugin client talks to Python directly.
package launch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// PythonEnv names the interpreter to use; unset, the first python3 on
// PATH with everything Needs lists is used.
const PythonEnv = "COHORT_PYTHON"

// MinPython is the oldest Python the SDK runs on.
var MinPython = [2]int{3, 9}

// Needs are the modules the trainer imports, by import name, with the
// package a user installs for each.
var Needs = []struct{ Module, Package string }{
	{"torch", "torch (Debian: python3-torch)"},
	{"grpc", "grpcio (Debian: python3-grpcio)"},
	// The generated code's builder module came with protobuf 3.20.
	{"google.protobuf.internal.builder", "protobuf >= 3.20 (Debian: python3-protobuf)"},
}

// probe prints the interpreter's version and the modules of Needs it
// lacks, as JSON; find_spec does not import them, so it takes milliseconds.
const probe = `import importlib.util, json, sys
def has(m):
    try:
        return importlib.util.find_spec(m) is not None
    except ImportError:
        return False
print(json.dumps({"version": list(sys.version_info[:3]), "missing": [m for m in sys.argv[1:] if not has(m)]}))`

// Interpreter is a Python that was probed.
type Interpreter struct {
	Path    string
	Version [3]int
	// Missing are the packages (Needs' Package) it lacks.
	Missing []string
}

// OK reports whether the interpreter can run the trainer.
func (i Interpreter) OK() bool {
	return len(i.Missing) == 0 && !i.tooOld()
}

func (i Interpreter) tooOld() bool {
	return i.Version[0] < MinPython[0] || i.Version[0] == MinPython[0] && i.Version[1] < MinPython[1]
}

func (i Interpreter) String() string {
	var lacks []string
	if i.tooOld() {
		lacks = append(lacks, fmt.Sprintf("is Python %d.%d.%d, older than %d.%d", i.Version[0], i.Version[1], i.Version[2], MinPython[0], MinPython[1]))
	}
	if len(i.Missing) > 0 {
		lacks = append(lacks, "lacks "+strings.Join(i.Missing, ", "))
	}
	if len(lacks) == 0 {
		return fmt.Sprintf("%s (Python %d.%d.%d)", i.Path, i.Version[0], i.Version[1], i.Version[2])
	}
	return i.Path + " " + strings.Join(lacks, " and ")
}

// Probe asks the interpreter at path what it is and what it lacks.
func Probe(ctx context.Context, path string) (Interpreter, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	args := []string{"-c", probe}
	for _, n := range Needs {
		args = append(args, n.Module)
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && len(ee.Stderr) > 0 {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return Interpreter{}, fmt.Errorf("probe %s: %w", path, err)
	}
	var got struct {
		Version []int    `json:"version"`
		Missing []string `json:"missing"`
	}
	if err := json.Unmarshal(out, &got); err != nil || len(got.Version) != 3 {
		return Interpreter{}, fmt.Errorf("probe %s: unexpected answer %q", path, strings.TrimSpace(string(out)))
	}
	in := Interpreter{Path: path, Version: [3]int{got.Version[0], got.Version[1], got.Version[2]}}
	for _, m := range got.Missing {
		for _, n := range Needs {
			if n.Module == m {
				in.Missing = append(in.Missing, n.Package)
			}
		}
	}
	return in, nil
}

// Find picks the interpreter: the one PythonEnv names (explicit, when not
// empty), else the first python3 on the search path (PATH's syntax) that
// has what Needs lists. The error names every interpreter tried and what
// each lacks.
func Find(ctx context.Context, explicit, search string) (Interpreter, error) {
	var candidates []string
	if explicit != "" {
		candidates = []string{explicit}
	} else {
		seen := map[string]bool{}
		for _, dir := range filepath.SplitList(search) {
			p := filepath.Join(dir, "python3")
			if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode().Perm()&0o111 == 0 {
				continue
			}
			real, err := filepath.EvalSymlinks(p)
			if err != nil || seen[real] {
				continue
			}
			seen[real] = true
			candidates = append(candidates, p)
		}
	}
	if len(candidates) == 0 {
		return Interpreter{}, fmt.Errorf("trainer-pytorch needs Python >= %d.%d with %s: no python3 on PATH (set %s to an interpreter)",
			MinPython[0], MinPython[1], needList(), PythonEnv)
	}
	var tried []string
	for _, c := range candidates {
		in, err := Probe(ctx, c)
		if err != nil {
			tried = append(tried, err.Error())
			continue
		}
		if in.OK() {
			return in, nil
		}
		tried = append(tried, in.String())
	}
	return Interpreter{}, fmt.Errorf("trainer-pytorch needs Python >= %d.%d with %s: %s (set %s to an interpreter that has them)",
		MinPython[0], MinPython[1], needList(), strings.Join(tried, "; "), PythonEnv)
}

func needList() string {
	var out []string
	for _, n := range Needs {
		out = append(out, n.Package)
	}
	return strings.Join(out, ", ")
}
