package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// The run secret reaches a process through one of these, never argv: a
// command line is visible to every user of the machine and ends up in logs.
const (
	envSecret     = "COHORT_SECRET"
	envSecretFile = "COHORT_SECRET_FILE"
)

// secretFileFlag adds --secret-file to a command that joins a run started
// elsewhere. `cohort run` has none: it makes its own secret.
func secretFileFlag(cmd *cobra.Command) *string {
	return cmd.Flags().String("secret-file", "", "file holding the run secret (default: $"+envSecretFile+", else $"+envSecret+")")
}

// loadSecret reads the run secret from file when it is set, else from the
// file $COHORT_SECRET_FILE names, else from $COHORT_SECRET.
func loadSecret(file string) ([]byte, error) {
	if file == "" {
		file = os.Getenv(envSecretFile)
	}
	var secret []byte
	switch {
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("read run secret: %w", err)
		}
		secret = bytes.TrimSpace(b)
	case os.Getenv(envSecret) != "":
		secret = []byte(os.Getenv(envSecret))
	default:
		return nil, errors.New("no run secret: set --secret-file, $" + envSecretFile + " or $" + envSecret)
	}
	if len(secret) < 16 {
		return nil, fmt.Errorf("run secret is %d bytes; at least 16 are needed", len(secret))
	}
	return secret, nil
}

// newSecret makes a random secret for a local run.
func newSecret() ([]byte, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("make run secret: %w", err)
	}
	return []byte(hex.EncodeToString(b[:])), nil
}
