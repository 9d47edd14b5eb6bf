// Command cohort-trainer-pytorch is cohort's trainer for plain PyTorch
// code: `trainer "pytorch" { file = "train.py" }` trains the model,
// optimizer, data and loss that the user's Python file defines. This Go
// binary is the launcher the plugin host starts and checksums: it finds a
// Python with torch, grpcio and protobuf (naming what is missing when none
// has them), and replaces itself with that interpreter running the Python
// SDK (shared/python) and the runner (runner/__main__.py), both embedded
// here, from an in-memory zip. The interpreter then speaks go-plugin's
// handshake and the Trainer service itself. See README.md.
package main

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/cohortdl/cohort/plugins/trainer-pytorch/internal/launch"
	"github.com/cohortdl/cohort/shared/python"
)

//go:embed runner/__main__.py
var runner embed.FS

func main() {
	if err := run(); err != nil {
		// As Go plugins report a failed start: one hclog JSON line, which
		// the host re-logs at error level and quotes in its own error.
		line, _ := json.Marshal(map[string]string{
			"@level": "error", "@message": "plugin failed to start", "@module": "trainer-pytorch",
			"@timestamp": time.Now().Format(time.RFC3339Nano), "error": err.Error(),
		})
		fmt.Fprintln(os.Stderr, string(line))
		os.Exit(1)
	}
}

func run() error {
	if os.Getenv("COHORT_PLUGIN_MAGIC_COOKIE") == "" {
		return fmt.Errorf("cohort-trainer-pytorch is a cohort plugin; cohort starts it, it is not meant to be run directly")
	}
	py, err := launch.Find(context.Background(), os.Getenv(launch.PythonEnv), os.Getenv("PATH"))
	if err != nil {
		return err
	}
	main, err := fs.Sub(runner, "runner")
	if err != nil {
		return err
	}
	zip, err := launch.Bundle(python.SDK, main)
	if err != nil {
		return err
	}
	code, err := launch.MemFile("cohort-trainer-pytorch.zip", zip)
	if err != nil {
		return err
	}
	env := append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	if os.Getenv("PLUGIN_CLIENT_CERT") != "" {
		cert, key, err := launch.Cert()
		if err != nil {
			return err
		}
		r, w, err := os.Pipe()
		if err != nil {
			return fmt.Errorf("pipe for the plugin's TLS key: %w", err)
		}
		// A few hundred bytes: the pipe's buffer holds them until Python reads.
		if _, err := w.Write(append(cert, key...)); err != nil {
			return fmt.Errorf("hand over the plugin's TLS key: %w", err)
		}
		w.Close()
		if err := launch.Inheritable(r); err != nil {
			return err
		}
		env = append(env, "COHORT_PLUGIN_TLS_FD="+strconv.Itoa(int(r.Fd())))
	}
	argv := []string{py.Path, "/proc/self/fd/" + strconv.Itoa(int(code.Fd()))}
	if err := syscall.Exec(py.Path, argv, env); err != nil {
		return fmt.Errorf("exec %s: %w", py.Path, err)
	}
	return nil
}
