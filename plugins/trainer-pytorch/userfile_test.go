package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cohortdl/cohort/shared/plugin"
	"github.com/cohortdl/cohort/shared/plugintest/conformance"
)

// What a user's mistake gets: an error that names their file and line and
// says what went wrong, from the call where it shows.
func TestUserFileErrors(t *testing.T) {
	bin := buildPlugin(t)
	cases := []struct {
		file   string
		train  bool     // the error shows in Train, not Configure
		naming []string // what the error must say
	}{
		{"raises.py", false, []string{"raises.py:12", "model(cfg)", "ValueError: no model today"}},
		{"misfit.py", false, []string{"misfit.py:19", "does not fit the targets", "(2, 3)", "labels 3 to 4"}},
		{"nan.py", true, []string{"nan.py:19", "returned nan at batch 0 of epoch 0"}},
		{"absent.py", false, []string{"absent.py: no such file"}},
		{"bytebuffer.py", false, []string{"bytebuffer.py", "buffer 'mask' is torch.uint8", "the arena holds float32, float64, bfloat16, float16, int64 and int32"}},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			file, err := filepath.Abs(filepath.Join("testdata", c.file))
			if err != nil {
				t.Fatal(err)
			}
			tr, err := conformance.TrainerBinary(bin)(conformance.Testing(t))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			setup, err := tr.Configure(ctx, plugin.TrainerConfig{WorldSize: 1, LocalRanks: 1, Seed: 1, Settings: settings(t, map[string]any{"file": file})})
			if c.train {
				if err != nil {
					t.Fatalf("Configure: %v", err)
				}
				err = trainOnce(ctx, t, tr, setup)
			}
			if err == nil {
				t.Fatalf("%s: no error", c.file)
			}
			for _, want := range c.naming {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the error does not say %q: %v", want, err)
				}
			}
		})
	}
}
