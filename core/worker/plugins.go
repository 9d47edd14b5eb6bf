package worker

import (
	"github.com/cohortdl/cohort/core/pluginhost"
	"github.com/cohortdl/cohort/core/worker/supervisor"
	"github.com/cohortdl/cohort/shared/plugin"
)

// The ways a rank's plugins run are core/worker/supervisor's; these names
// keep them where a user of Run looks for them.
type (
	// Plugins launches a rank's trainer and averager and stops them (see
	// supervisor.Plugins).
	Plugins = supervisor.Plugins
	// Replaceable is what Plugins offer when their plugins run as
	// processes that can be lost and replaced (see supervisor.Replaceable).
	Replaceable = supervisor.Replaceable
	// HostPlugins runs plugins as processes through core/pluginhost.
	HostPlugins = supervisor.HostPlugins
)

// NewHostPlugins makes a HostPlugins over a pluginhost.Host with o.
func NewHostPlugins(o pluginhost.Options) *HostPlugins { return supervisor.NewHostPlugins(o) }

// InProcess serves the given implementations from this process: for tests
// and for embedding cohort in a Go program. StopAll calls their Shutdown.
func InProcess(t plugin.Trainer, a plugin.Averager) Plugins { return supervisor.InProcess(t, a) }
