package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/wire"
	"github.com/cohortdl/cohort/shared/mtls"
	"github.com/cohortdl/cohort/shared/plugin"
)

// Defaults for zero Options fields.
const (
	DefaultLivenessTimeout   = 30 * time.Second
	DefaultConnectTimeout    = 30 * time.Second
	DefaultShutdownGrace     = 5 * time.Second
	DefaultHeartbeatInterval = time.Second
	DefaultResourceInterval  = 500 * time.Millisecond
)

// DataKeyLabel names the key, derived from the run secret, that the
// averager's own data channel authenticates with.
const DataKeyLabel = wire.AveragingDataKeyLabel

// Options configure one rank worker.
type Options struct {
	// Coordinator is the control server's address, host:port.
	Coordinator string
	// Rank is this worker's global rank in 0..World.
	Rank, World uint32
	// Secret is the run's shared secret; keys are derived from it and it is
	// never sent anywhere.
	Secret []byte

	// Trainer and Averager name the plugins and carry their settings,
	// passed through uninterpreted.
	Trainer, Averager config.Plugin
	// CheckSettings, when set, checks a plugin's settings (kind is
	// plugin.KindTrainer or KindAverager) against the schema its Describe
	// declares, before Configure: FromConfig's names the config file's
	// line and key. Its error ends the rank.
	CheckSettings func(kind string, schema []plugin.SettingSpec) error

	// Plugins launches and stops the plugins. Nil: real plugin processes
	// found in PluginDirs (then PATH) through core/pluginhost, with
	// ShutdownGrace and Withhold. Run stops whatever it started.
	Plugins Plugins
	// PluginDirs are searched for plugin binaries before PATH.
	PluginDirs []string
	// Withhold names environment variables the plugins must not see.
	Withhold []string
	// PluginLock is the plugin lock file (config worker.plugin_lock): a
	// plugin it names must still hash to the checksum recorded at install.
	// Empty or missing: no lock. The plugins' version constraints come
	// from Trainer.Version and Averager.Version.
	PluginLock string
	// PluginRestarts is how many times the rank may replace a plugin that
	// died or wedged (config worker.plugin_restarts); 0 ends the rank at
	// the first such failure. Only plugins run as processes are replaced.
	PluginRestarts int

	// TLS, when set (config worker.tls), runs the control connection in
	// mutual TLS (the coordinator's certificate must chain to TLS.CA and
	// name the host in Coordinator) and hands the files to the averager
	// for its own channel.
	TLS mtls.Files

	// LocalRanks is the number of ranks on this host (default 1).
	LocalRanks uint32

	// LivenessTimeout: coordinator silence that ends the worker.
	LivenessTimeout time.Duration
	// ConnectTimeout: how long the first connection is retried.
	ConnectTimeout time.Duration
	// ShutdownGrace: how long each plugin gets to shut down, and the bound
	// on each teardown call into a plugin.
	ShutdownGrace time.Duration
	// HeartbeatInterval: the Heartbeat cadence.
	HeartbeatInterval time.Duration
	// ResourceInterval: the ResourceSample cadence; negative disables them.
	ResourceInterval time.Duration

	// ArenaDir holds the parameter arena (default /dev/shm).
	ArenaDir string

	// EASGDAlpha, when above 0, blends averaged parameters into the local
	// ones on Adopt (the async policy's elastic averaging) instead of
	// overwriting them. Broadcast rounds always overwrite.
	EASGDAlpha float64

	// EpochFn, when set, runs before the first plan of each epoch on the
	// rank that holds the epoch-callback role; its time is reported as
	// EpochFnElapsed.
	EpochFn func(ctx context.Context, epoch uint64) error

	Logger hclog.Logger
}

// FromConfig fills the options a config file decides: plugin choice and
// settings, the worker block's timeouts and plugin directory, and the EASGD
// blend when the policy is async. The caller adds the coordinator address,
// rank, world, secret and logger.
func FromConfig(c *config.Config) Options {
	o := Options{
		Trainer:         c.Trainer,
		Averager:        c.Averager,
		CheckSettings:   c.CheckPluginSettings,
		LivenessTimeout: c.Worker.LivenessTimeout,
		ConnectTimeout:  c.Worker.ConnectTimeout,
		ShutdownGrace:   c.Worker.ShutdownGrace,
		PluginLock:      c.Worker.PluginLock,
		PluginRestarts:  c.Worker.PluginRestarts,
		TLS:             c.Worker.TLS,
	}
	if c.Worker.PluginDir != "" {
		o.PluginDirs = []string{c.Worker.PluginDir}
	}
	// Only the async policy blends: under sync and cadence every rank must
	// hold the consensus after a round.
	if c.Coordinator.Policy == config.PolicyAsync {
		o.EASGDAlpha = c.Coordinator.EASGDAlpha
	}
	return o
}

// withDefaults validates o and fills its zero fields.
func (o Options) withDefaults() (Options, error) {
	var errs []error
	if o.Coordinator == "" {
		errs = append(errs, errors.New("no coordinator address"))
	}
	if o.World == 0 || o.Rank >= o.World {
		errs = append(errs, fmt.Errorf("rank %d out of range for world size %d", o.Rank, o.World))
	}
	if len(o.Secret) < wire.MinSecretLen {
		errs = append(errs, fmt.Errorf("secret is %d bytes, want at least %d", len(o.Secret), wire.MinSecretLen))
	}
	if o.Trainer.Name == "" {
		errs = append(errs, errors.New("no trainer plugin named"))
	}
	if o.Averager.Name == "" {
		errs = append(errs, errors.New("no averager plugin named"))
	}
	if !(o.EASGDAlpha >= 0 && o.EASGDAlpha <= 1) {
		errs = append(errs, fmt.Errorf("EASGD alpha %v is outside [0, 1]", o.EASGDAlpha))
	}
	if err := errors.Join(errs...); err != nil {
		return o, err
	}
	if o.LocalRanks == 0 {
		o.LocalRanks = 1
	}
	setDefault(&o.LivenessTimeout, DefaultLivenessTimeout)
	setDefault(&o.ConnectTimeout, DefaultConnectTimeout)
	setDefault(&o.ShutdownGrace, DefaultShutdownGrace)
	setDefault(&o.HeartbeatInterval, DefaultHeartbeatInterval)
	if o.ResourceInterval == 0 {
		o.ResourceInterval = DefaultResourceInterval
	}
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	return o, nil
}

// averagerTLS is the TLS files the averager gets: nil without TLS.
func (o Options) averagerTLS() *plugin.TLSFiles {
	if !o.TLS.Enabled() {
		return nil
	}
	f := o.TLS
	return &f
}

func setDefault(d *time.Duration, def time.Duration) {
	if *d <= 0 {
		*d = def
	}
}
