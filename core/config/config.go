// Package config is the run's HCL config file: schema, defaults, validation.
//
// A file has three core blocks (run, coordinator, worker) whose keys the core
// reads, and two plugin blocks (trainer "NAME", averager "NAME") whose bodies
// it does not interpret: every attribute but version (the core's constraint
// on the plugin's own version) is evaluated and the lot goes to the plugin
// as one JSON object. Every block and key is optional; what a file
// leaves out comes from the built-in default (DefaultFile). Errors name the
// file, line and key: `cohort.hcl:7,3-9: coordinator.policy: "fast" is not
// one of sync, cadence, async`.
package config

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/cohortdl/cohort/shared/mtls"
)

// Config is one run's configuration.
type Config struct {
	Run         Run
	Coordinator Coordinator
	Worker      Worker
	Trainer     Plugin
	Averager    Plugin
	// Path is the file the config was read from; empty for Default.
	Path string

	// where holds the source of each key set by the file or a flag, by
	// "block.key" (and "trainer", "averager" for the plugin names), for
	// error messages.
	where map[string]hcl.Range
}

// Run is the run block: the cohort's size and length.
type Run struct {
	Ranks  int    // rank workers, at least 1
	Epochs int    // at least 1
	Seed   int64  // the run's random seed
	Out    string // output directory (checkpoints, metrics), as written
}

// Policy is when the coordinator triggers averaging.
type Policy string

// The averaging policies.
const (
	PolicySync    Policy = "sync"    // every SyncEvery batches
	PolicyCadence Policy = "cadence" // faster ranks get more batches so all arrive together
	PolicyAsync   Policy = "async"   // elastic averaging (EASGD)
)

// Policies lists the valid policies.
var Policies = []Policy{PolicySync, PolicyCadence, PolicyAsync}

// The eval_rank policies besides a fixed rank number.
const (
	EvalRankLowest  = "lowest"  // the lowest live rank
	EvalRankFastest = "fastest" // the live rank with the lowest batch time
)

// FixedEvalRank returns the rank eval_rank names by number, if it does.
func (co Coordinator) FixedEvalRank() (uint32, bool) {
	n, err := strconv.ParseUint(co.EvalRank, 10, 32)
	return uint32(n), err == nil
}

// Coordinator is the coordinator block.
type Coordinator struct {
	Listen           string        // control server address, host:port
	ReducePort       int           // the reduce server's port on the listen host; 0: any free port
	HTTP             string        // status page, API and metrics, host:port; "": none
	HeartbeatTimeout time.Duration // rank silence that declares it dead, at least 1s
	FormationTimeout time.Duration // how long to wait for every rank to join
	Policy           Policy
	SyncEvery        int     // batches between averaging rounds, for sync; at least 1
	MinRanks         int     // fewest live ranks that may carry on, in [1, Run.Ranks]
	CheckpointEvery  int     // epochs between checkpoints; 0: only on ShutdownWithSave
	CheckpointKeep   int     // the newest checkpoints a run keeps; 0: all
	ChunkBatches     int     // progressive dispatch chunk size; 0: the policy's default
	OverheadTarget   float64 // cadence: sync overhead share that grows the window, in (0,1)
	EASGDAlpha       float64 // async: elastic averaging strength, in (0,1]
	// AsyncOverlap (async): ranks whose trainer can train during a round
	// run their rounds beside training, keeping their parameters out of
	// the arena to do so; false keeps every round blocking (and a CPU
	// trainer's parameters in the arena, zero-copy).
	AsyncOverlap bool
	// AdaptiveSync lets the divergence the ranks report after each round
	// move the sync interval (sync, async) between SyncEveryMin and
	// SyncEveryMax: tighter when ranks drift past DivergenceTarget, looser
	// when they stay well inside it.
	AdaptiveSync bool
	SyncEveryMin int // at least 1
	SyncEveryMax int // 0: SyncEvery (the interval only tightens)
	// DivergenceTarget is the relative distance from the average the
	// interval aims at; 0: 0.05, or 0.01 where the trainer's optimizer is
	// adaptive (dispatch.DivergenceTarget, AdaptiveDivergenceTarget).
	DivergenceTarget float64
	// GuardFactor: a round whose divergence exceeds GuardFactor times the
	// running mean is a spike: the interval drops to SyncEveryMin and the
	// learning rate is scaled by GuardLRFactor until divergence settles.
	// 0: no guard.
	GuardFactor   float64
	GuardLRFactor float64 // in (0, 1]
	// LRPlateauPatience: epochs without a better eval loss after which the
	// learning rate is scaled by LRPlateauFactor; 0: no plateau rule.
	LRPlateauPatience int
	LRPlateauFactor   float64 // in (0, 1)
	// MaxBatchDiff bounds how far ranks drift apart in batches: under
	// async a rank more than this many batches ahead of the slowest busy
	// rank since the last round is throttled until the round; under
	// cadence a rank's window count moves at most this much per window.
	// 0: no bound.
	MaxBatchDiff int
	// EvalRank says which rank evaluates and runs the epoch callback:
	// EvalRankLowest, EvalRankFastest, or a rank number ("2"; while that
	// rank is dead, the lowest live rank stands in).
	EvalRank string
	// EvalEvery is the epochs between evaluations; 0: never. When above 0
	// the run's last epoch is evaluated too, so the final accuracy exists.
	EvalEvery int
	// TLS, when set (the tls sub-block), puts the control server and the
	// reduce server behind mutual TLS: ranks must present a certificate
	// from TLS.CA. Paths are absolute (a file's relative ones are resolved
	// beside it).
	TLS mtls.Files
}

// Worker is the worker block: the rank process's own timeouts and paths.
type Worker struct {
	LivenessTimeout time.Duration // coordinator silence that ends the worker
	ConnectTimeout  time.Duration // how long to retry the first connection
	PluginDir       string        // where plugin binaries are looked up
	ShutdownGrace   time.Duration // how long plugins get to drain before they are killed
	// PluginLock is the lock file `cohort plugins install` records the
	// accepted plugins' checksums in; a worker refuses a locked plugin
	// whose binary no longer matches. The CLI reads a relative path as
	// beside the config file; a missing file locks nothing, and empty
	// means no lock file.
	PluginLock string
	// PluginRestarts is how many times a rank may replace a plugin that
	// died or wedged with a fresh process; one more failure ends the rank.
	PluginRestarts int
	// TLS, when set (the tls sub-block), is the worker's mutual TLS to the
	// coordinator and, through its averager, to the reduce server.
	TLS mtls.Files
}

// Plugin is a trainer or averager block: the plugin's name (the block's
// label) and its body as a JSON object, passed through verbatim, less the
// one key the core takes for itself: version.
type Plugin struct {
	Name     string
	Settings json.RawMessage
	// Version constrains the plugin's own version, as its Describe reports
	// it (">= 1.2, < 2", in github.com/hashicorp/go-version's syntax); the
	// worker refuses a plugin outside it. Empty: any version.
	Version string
}

// MaxFileSize bounds a config file: HCL arithmetic on big numbers grows
// with the file, and no honest config comes near it.
const MaxFileSize = 1 << 20

//go:embed default.hcl
var defaultFile []byte

// DefaultFile returns the source of the built-in configuration, with a
// comment on every key: a starting point for a config file.
func DefaultFile() []byte { return bytes.Clone(defaultFile) }

var parsedDefault = sync.OnceValue(func() *Config {
	c := &Config{where: map[string]hcl.Range{}}
	if _, err := c.decode(defaultFile, "default.hcl"); err != nil {
		panic("config: the built-in default does not parse: " + err.Error())
	}
	if err := c.Validate(); err != nil {
		panic("config: the built-in default is not valid: " + err.Error())
	}
	return c
})

// Default returns the built-in configuration (DefaultFile, which names
// the plugins it trains with).
func Default() *Config {
	d := parsedDefault()
	return &Config{
		Run:         d.Run,
		Coordinator: d.Coordinator,
		Worker:      d.Worker,
		Trainer:     Plugin{Name: d.Trainer.Name, Settings: bytes.Clone(d.Trainer.Settings), Version: d.Trainer.Version},
		Averager:    Plugin{Name: d.Averager.Name, Settings: bytes.Clone(d.Averager.Settings), Version: d.Averager.Version},
	}
}

// Load reads and parses the config file at path.
func Load(path string) (*Config, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(src, path)
}

// Parse parses a config file's source, fills what it leaves out from the
// default and validates the result. filename names the source in errors
// and becomes Path. The error lists every problem found, one a line; each
// is an *Error (errors.As finds the first).
func Parse(src []byte, filename string) (*Config, error) {
	c, _, err := decodeFile(src, filename)
	if err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// LoadUnchecked reads and decodes a config file like Load, but leaves
// Validate to the caller and goes on past the file's mistakes, so that
// `cohort validate` reports them all in one pass with Validate's and the
// plugins': the Config holds what decoded (a key that did not keeps its
// default) and the error lists every mistake. The Config is nil only when
// the file could not be read or parsed, with nothing to check further.
func LoadUnchecked(path string) (*Config, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c, parsed, err := decodeFile(src, path)
	if !parsed {
		return nil, err
	}
	return c, err
}

// decodeFile decodes src over the default; parsed is false when src is
// not HCL at all.
func decodeFile(src []byte, filename string) (c *Config, parsed bool, err error) {
	if len(src) > MaxFileSize {
		return nil, false, &Error{Range: hcl.Range{Filename: filename},
			Msg: fmt.Sprintf("%d bytes is more than a config file may have (%d)", len(src), MaxFileSize)}
	}
	c = Default()
	c.Path = filename
	c.where = map[string]hcl.Range{}
	parsed, err = c.decode(src, filename)
	return c, parsed, err
}

// ErrorAt is err as a mistake of key ("trainer", "coordinator.policy"),
// at the line that set it: for a problem found outside the file (a
// plugin that is missing or refuses its block) to name the file and line
// as the file's own mistakes do.
func (c *Config) ErrorAt(key string, err error) *Error {
	return &Error{Range: c.at(key), Key: key, Msg: err.Error()}
}

// clone returns a copy of c that shares nothing mutable with it.
func (c *Config) clone() *Config {
	d := *c
	d.Trainer.Settings = bytes.Clone(c.Trainer.Settings)
	d.Averager.Settings = bytes.Clone(c.Averager.Settings)
	d.where = maps.Clone(c.where)
	if d.where == nil {
		d.where = map[string]hcl.Range{}
	}
	return &d
}
