package config

import (
	"github.com/hashicorp/hcl/v2"
)

// Overrides are the command line's say over the file: a nil or empty field
// leaves the file's value alone.
type Overrides struct {
	Ranks  *int    // --ranks: run.ranks
	Epochs *int    // --epochs: run.epochs
	Out    *string // --out: run.out
	// Trainer (--trainer) and Averager (--averaging) name a plugin. The
	// block's settings are kept when the name is the one already
	// configured and dropped (an empty object) when it names another
	// plugin, since settings belong to the plugin they were written for.
	Trainer  string
	Averager string
}

// Apply applies o and validates the result. On error c is unchanged; the
// error names the flag for a value it set ("--ranks: run.ranks: must be at
// least 1, got 0").
func (c *Config) Apply(o Overrides) error {
	d := c.clone()
	flag := func(key, name string) { d.where[key] = hcl.Range{Filename: name} }
	if o.Ranks != nil {
		d.Run.Ranks = *o.Ranks
		flag("run.ranks", "--ranks")
	}
	if o.Epochs != nil {
		d.Run.Epochs = *o.Epochs
		flag("run.epochs", "--epochs")
	}
	if o.Out != nil {
		d.Run.Out = *o.Out
		flag("run.out", "--out")
	}
	setPlugin := func(p *Plugin, name, key, flagName string) {
		if name == "" || name == p.Name {
			return
		}
		*p = Plugin{Name: name, Settings: []byte("{}")}
		flag(key, flagName)
	}
	setPlugin(&d.Trainer, o.Trainer, "trainer", "--trainer")
	setPlugin(&d.Averager, o.Averager, "averager", "--averaging")
	if err := d.Validate(); err != nil {
		return err
	}
	*c = *d
	return nil
}
