// The final JSON line's types, the policy's name, and the text helpers.

package main

import (
	"fmt"

	"github.com/cohortdl/cohort/core/config"
)

// report is the final JSON line.
type report struct {
	Bench    string        `json:"bench"`
	Settings settingsJSON  `json:"settings"`
	Matrix   []*ddpReport  `json:"matrix,omitempty"`
	Single   *singleReport `json:"single,omitempty"`
	Hetero   *heteroReport `json:"hetero,omitempty"`
	WallS    float64       `json:"wall_s"`
}

type settingsJSON struct {
	Ranks        int     `json:"ranks"`
	Epochs       int     `json:"epochs"`
	SingleEpochs int     `json:"single_epochs"`
	TargetEpochs int     `json:"target_epochs"`
	Target       float64 `json:"target"`
	LR           float64 `json:"lr"`
	Momentum     float64 `json:"momentum"`
	Batch        int     `json:"batch_per_rank"`
	Threads      int     `json:"threads_per_rank"`
	Averager     string  `json:"averager"`
	Policy       string  `json:"policy"`
	SyncEvery    int     `json:"sync_every"`
	// BuiltInPolicy: neither -policy nor -sync-every was given.
	BuiltInPolicy bool   `json:"built_in_policy"`
	Data          string `json:"data"`
}

// policyName and syncEveryValue are the policy cohort runs with.
func policyName(p string) string {
	if p == "" {
		return defaultPolicy
	}
	return p
}

func syncEveryValue(n int) int {
	if n == 0 {
		return defaultSyncEvery
	}
	return n
}

func verdict(pass bool) string {
	if pass {
		return "PASS"
	}
	return "MISS"
}

func secs(v *float64) string {
	if v == nil {
		return "not reached"
	}
	return fmt.Sprintf("%.2f s", *v)
}

func ratioStr(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.3f", *v)
}

// describePolicy says when cohort averages: "sync every 10 batches (the
// built-in default)".
func describePolicy(policy string, syncEvery int) string {
	p, n := policyName(policy), syncEveryValue(syncEvery)
	d := fmt.Sprintf("%s, sync_every %d", p, n)
	if p == string(config.PolicySync) {
		d = fmt.Sprintf("sync every %d batches", n)
	}
	if policy == "" && syncEvery == 0 {
		d += " (the built-in default)"
	}
	return d
}
