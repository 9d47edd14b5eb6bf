// Package matrix is the JSON line a cohort-against-DDP row prints, shared
// by the one-host matrix (bench/training) and the cross-host rows
// (bench/hosts) so both speak one schema.
package matrix

// Line is one row: a model against DDP over gloo, means over its seeds.
// A time to the target is null where that side never reached it.
type Line struct {
	Bench          string   `json:"bench"`
	Model          string   `json:"model"`
	Optimizer      string   `json:"optimizer"`
	Where          string   `json:"where"`
	Params         int      `json:"params"`
	Seeds          int      `json:"seeds"`
	Target         float64  `json:"target"`
	CohortAccuracy float64  `json:"cohort_accuracy"`
	DDPAccuracy    float64  `json:"ddp_accuracy"`
	AccDiffPoints  float64  `json:"accuracy_diff_points"`
	TimeRatio      *float64 `json:"time_ratio"`
	CohortToTarget *float64 `json:"cohort_seconds_to_target"`
	DDPToTarget    *float64 `json:"ddp_seconds_to_target"`
	Bytes          float64  `json:"bytes_per_rank_epoch"`
	DDPBytes       float64  `json:"ddp_bytes_per_rank_epoch"`
}
