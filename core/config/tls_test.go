package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cohortdl/cohort/shared/mtls"
)

// tlsDir writes a cluster's TLS files (hosts coord and node) into a
// temporary directory, as `cohort tls init` does.
func tlsDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := mtls.WriteCluster(dir, []string{"coord", "node"}, mtls.Loopback, time.Hour); err != nil {
		t.Fatal(err)
	}
	return dir
}

// tls blocks nest in coordinator and worker; relative paths are beside the
// config file, whatever the working directory.
func TestParseTLS(t *testing.T) {
	dir := tlsDir(t)
	src := `coordinator {
  tls {
    ca   = "ca.pem"
    cert = "coord.pem"
    key  = "coord-key.pem"
  }
}
worker {
  tls {
    ca   = "` + filepath.Join(dir, "ca.pem") + `"
    cert = "node.pem"
    key  = "node-key.pem"
  }
}
`
	c := mustParse(t, src, filepath.Join(dir, "cohort.hcl"))
	if want := mtls.HostFiles(dir, "coord"); c.Coordinator.TLS != want {
		t.Errorf("coordinator.tls = %+v, want %+v", c.Coordinator.TLS, want)
	}
	if want := mtls.HostFiles(dir, "node"); c.Worker.TLS != want {
		t.Errorf("worker.tls = %+v, want %+v", c.Worker.TLS, want)
	}
	if d := Default(); d.Coordinator.TLS.Enabled() || d.Worker.TLS.Enabled() {
		t.Error("the default config has TLS on")
	}

	// What the launcher writes for its workers reads back the same, tls
	// blocks included.
	c.Path = "written.hcl"
	checkSame(t, roundTrip(t, c), c)
}

func TestTLSErrorsNameFileLineAndKey(t *testing.T) {
	dir := tlsDir(t)
	other := tlsDir(t)
	block := func(side, body string) string {
		return side + " {\n  tls {\n" + body + "  }\n}\n"
	}
	files := func(ca, cert, key string) string {
		return `    ca   = "` + ca + "\"\n    cert = \"" + cert + "\"\n    key  = \"" + key + "\"\n"
	}
	host := mtls.HostFiles(dir, "node")
	for _, tc := range []struct {
		name, src, at, says string
	}{
		{"missing CA file", block("worker", files(filepath.Join(dir, "nope.pem"), host.Cert, host.Key)),
			"cohort.hcl:3,5-7: worker.tls.ca: ", "no such file"},
		{"key of another host", block("coordinator", files(host.CA, host.Cert, mtls.HostFiles(dir, "coord").Key)),
			"cohort.hcl:4,5-9: coordinator.tls.cert: ", "private key does not match"},
		{"certificate of another CA", block("worker", files(host.CA, mtls.HostFiles(other, "node").Cert, mtls.HostFiles(other, "node").Key)),
			"cohort.hcl:4,5-9: worker.tls.cert: ", "does not chain to the CA"},
		{"a key left out", block("worker", "    ca = \""+host.CA+"\"\n    cert = \""+host.Cert+"\"\n"),
			"cohort.hcl:2,3-6: worker.tls: ", "needs ca, cert and key"},
		{"unknown key", block("worker", files(host.CA, host.Cert, host.Key)+"    crt = \"x\"\n"),
			"cohort.hcl:6,5-8: worker.tls.crt: ", "unknown key; did you mean \"cert\"? worker.tls takes ca, cert, key"},
		{"two tls blocks", "worker {\n  tls {\n  }\n  tls {\n  }\n}\n",
			"cohort.hcl:4,3-6: worker.tls: ", "a second tls block"},
		{"unknown sub-block", "worker {\n  ssl {\n  }\n}\n",
			"cohort.hcl:2,3-6: worker: ", "Unexpected \"ssl\" block"},
		{"tls is a block, not a key", "coordinator {\n  tls = \"on\"\n}\n",
			"cohort.hcl:2,3-6: coordinator.tls: ", "unknown key; coordinator takes listen"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.src), "cohort.hcl")
			if err == nil || !strings.Contains(err.Error(), tc.at+"") || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("error:\n%v\nwant one at %q saying %q", err, tc.at, tc.says)
			}
		})
	}
}

// A tls file that turns unreadable after the config was read is caught by
// Validate, which the coordinator and worker call before they start.
func TestValidateRereadsTLSFiles(t *testing.T) {
	dir := tlsDir(t)
	c := Default()
	c.Worker.TLS = mtls.HostFiles(dir, "node")
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(c.Worker.TLS.Key); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "worker.tls.key") {
		t.Errorf("Validate after the key went: %v", err)
	}
}
