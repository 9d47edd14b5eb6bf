// Package python holds cohort's plugin SDK for trainers written in Python
// (the cohort_plugin package beside this file) for Go launchers to ship:
// SDK is its sources, which a launcher embeds in its own checksummed binary
// and hands to the interpreter it starts, so what runs is what was signed.
// The Python package itself is importable from a checkout
// (PYTHONPATH=shared/python) and installable (pyproject.toml); see
// README.md. Its generated gRPC code comes from shared/plugin's .proto
// files (gen.sh, run by make proto).
package python

import "embed"

// SDK is the cohort_plugin package's sources, under "cohort_plugin/".
//
//go:embed cohort_plugin/*.py cohort_plugin/_pb/*.py
var SDK embed.FS

// Package is the SDK's Python package name.
const Package = "cohort_plugin"
