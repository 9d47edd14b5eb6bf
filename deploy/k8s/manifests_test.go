// Package k8s holds cohort's Kubernetes manifests (the YAML files beside
// this one) and the test that decodes them strictly with the Kubernetes
// API types and checks them against the CLI's flags and variables: no
// cluster is needed to catch a typo.
package k8s

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/cohortdl/cohort/core/config"
)

// objects are the manifests' documents by kind/name.
type objects struct {
	jobs       map[string]*batchv1.Job
	services   map[string]*corev1.Service
	secrets    map[string]*corev1.Secret
	configMaps map[string]*corev1.ConfigMap
}

// strict decodes JSON into v, refusing a field the type does not have.
func strict(doc []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

func load(t *testing.T) objects {
	t.Helper()
	o := objects{jobs: map[string]*batchv1.Job{}, services: map[string]*corev1.Service{},
		secrets: map[string]*corev1.Secret{}, configMaps: map[string]*corev1.ConfigMap{}}
	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, part := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(raw), -1) {
			doc, err := yaml.YAMLToJSON([]byte(part))
			if err != nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			var meta struct{ Kind string }
			if err := json.Unmarshal(doc, &meta); err != nil || meta.Kind == "" {
				t.Fatalf("%s document %d: no kind (%v)", f, i, err)
			}
			where := fmt.Sprintf("%s document %d (%s)", f, i, meta.Kind)
			var name string
			switch meta.Kind {
			case "Job":
				var j batchv1.Job
				err, name = strict(doc, &j), j.Name
				o.jobs[name] = &j
			case "Service":
				var s corev1.Service
				err, name = strict(doc, &s), s.Name
				o.services[name] = &s
			case "Secret":
				var s corev1.Secret
				err, name = strict(doc, &s), s.Name
				o.secrets[name] = &s
			case "ConfigMap":
				var c corev1.ConfigMap
				err, name = strict(doc, &c), c.Name
				o.configMaps[name] = &c
			default:
				t.Fatalf("%s: a kind this test does not check", where)
			}
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			if name == "" {
				t.Fatalf("%s: no name", where)
			}
		}
	}
	return o
}

// cohortHelp is `cohort CMD --help`, from bin, a build of this checkout.
func cohortHelp(t *testing.T, bin, cmd string) string {
	t.Helper()
	out, err := exec.Command(bin, cmd, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("cohort %s --help: %v\n%s", cmd, err, out)
	}
	return string(out)
}

func env(c corev1.Container) map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		m[e.Name] = e.Value
	}
	return m
}

func flagValue(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

// mountedFile is where a container sees key of the volume named by a
// ConfigMap or Secret, or "".
func mountedFile(spec corev1.PodSpec, c corev1.Container, source, key string) string {
	for _, v := range spec.Volumes {
		if (v.ConfigMap != nil && v.ConfigMap.Name == source) || (v.Secret != nil && v.Secret.SecretName == source) {
			for _, m := range c.VolumeMounts {
				if m.Name == v.Name {
					return filepath.Join(m.MountPath, key)
				}
			}
		}
	}
	return ""
}

func TestManifests(t *testing.T) {
	o := load(t)
	coord, workers := o.jobs["cohort-coordinator"], o.jobs["cohort-workers"]
	svc, cm, secret := o.services["cohort-coordinator"], o.configMaps["cohort-config"], o.secrets["cohort-run-secret"]
	if coord == nil || workers == nil || svc == nil || cm == nil || secret == nil {
		t.Fatalf("want the coordinator and worker Jobs, the Service, the ConfigMap and the Secret; have %v", o)
	}
	cc, wc := coord.Spec.Template.Spec.Containers[0], workers.Spec.Template.Spec.Containers[0]

	// The config parses as cohort reads it, and both sides mount it where
	// their --config says.
	if _, err := config.Parse([]byte(cm.Data["cohort.hcl"]), "cohort.hcl"); err != nil {
		t.Errorf("the ConfigMap's cohort.hcl: %v", err)
	}
	for _, side := range []struct {
		name string
		spec corev1.PodSpec
		c    corev1.Container
	}{{"coordinator", coord.Spec.Template.Spec, cc}, {"worker", workers.Spec.Template.Spec, wc}} {
		if got, want := flagValue(side.c.Args, "--config"), mountedFile(side.spec, side.c, cm.Name, "cohort.hcl"); got == "" || got != want {
			t.Errorf("%s: --config %q, but the ConfigMap is mounted at %q", side.name, got, want)
		}
		if got, want := env(side.c)["COHORT_SECRET_FILE"], mountedFile(side.spec, side.c, secret.Name, "secret"); got == "" || got != want {
			t.Errorf("%s: COHORT_SECRET_FILE %q, but the Secret's key is mounted at %q", side.name, got, want)
		}
	}
	if _, ok := secret.StringData["secret"]; !ok {
		t.Error("the Secret has no key \"secret\"")
	}

	// Every flag the manifests pass exists on the command they call.
	bin := filepath.Join(t.TempDir(), "cohort")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/cohortdl/cohort/cmd/cohort").CombinedOutput(); err != nil {
		t.Fatalf("build cohort: %v\n%s", err, out)
	}
	for _, c := range []corev1.Container{cc, wc} {
		help := cohortHelp(t, bin, c.Args[0])
		for _, a := range c.Args[1:] {
			if strings.HasPrefix(a, "--") && !strings.Contains(help, a+" ") {
				t.Errorf("cohort %s has no flag %s", c.Args[0], a)
			}
		}
	}
	// The worker's variables are ones cohort worker reads.
	help := cohortHelp(t, bin, "worker")
	for name := range env(wc) {
		if name != "COHORT_SECRET_FILE" && !strings.Contains(help, name) {
			t.Errorf("the worker Job sets %s, which cohort worker does not read", name)
		}
	}

	// The workers are an Indexed Job of as many ranks as the world and as
	// the coordinator's --ranks, and they dial the Service's port, which
	// is the one the coordinator listens on.
	w := workers.Spec
	if w.CompletionMode == nil || *w.CompletionMode != batchv1.IndexedCompletion {
		t.Error("the worker Job is not Indexed: its pods would get no JOB_COMPLETION_INDEX")
	}
	world := env(wc)["COHORT_WORLD"]
	count := func(p *int32) string {
		if p == nil {
			return "unset"
		}
		return fmt.Sprint(*p)
	}
	if count(w.Completions) != world || count(w.Parallelism) != world || flagValue(cc.Args, "--ranks") != world {
		t.Errorf("completions %s, parallelism %s, COHORT_WORLD %q and the coordinator's --ranks %q must agree", count(w.Completions), count(w.Parallelism), world, flagValue(cc.Args, "--ranks"))
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Error("the Service is not headless: workers could not reach the coordinator's averaging ports")
	}
	for k, v := range svc.Spec.Selector {
		if coord.Spec.Template.Labels[k] != v {
			t.Errorf("the Service selects %s=%s, which the coordinator pod does not carry", k, v)
		}
	}
	listen := flagValue(cc.Args, "--listen")
	port := fmt.Sprint(svc.Spec.Ports[0].Port)
	if want := svc.Name + ":" + port; env(wc)["COHORT_COORDINATOR"] != want || !strings.HasSuffix(listen, ":"+port) {
		t.Errorf("workers dial %q, the Service serves %s, the coordinator listens on %q", env(wc)["COHORT_COORDINATOR"], want, listen)
	}
}
