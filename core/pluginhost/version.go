package pluginhost

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/go-version"

	"github.com/cohortdl/cohort/shared/plugin"
)

// describeTimeout bounds the Describe call a version check makes.
const describeTimeout = 10 * time.Second

// Protocol is the plugin protocol version the process negotiated.
func (p *Process) Protocol() int { return p.client.NegotiatedVersion() }

// CheckVersion reports whether a plugin's own version v satisfies the
// constraint (go-version syntax); an empty constraint admits any version.
// The error names the plugin, its version and the constraint.
func CheckVersion(kind Kind, name, v, constraint string) error {
	if constraint == "" {
		return nil
	}
	c, err := version.NewConstraint(constraint)
	if err != nil {
		return fmt.Errorf("%s plugin %q: version constraint %q: %w", kind, name, constraint, err)
	}
	got, err := version.NewVersion(v)
	if err != nil {
		return fmt.Errorf("%s plugin %q reports version %q, which is not a version the constraint %q can check: %w", kind, name, v, constraint, err)
	}
	if !c.Check(got) {
		return fmt.Errorf("%s plugin %q is version %s, which does not satisfy the config's constraint %q", kind, name, v, constraint)
	}
	return nil
}

// checkVersion asks the started plugin p for its version and checks it
// against the constraint Options.Versions holds for its kind.
func (h *Host) checkVersion(ctx context.Context, p *Process, describe func(context.Context) (plugin.Description, error)) error {
	constraint := h.opts.Versions[p.Kind]
	if constraint == "" {
		return nil
	}
	dctx, cancel := context.WithTimeout(ctx, describeTimeout)
	defer cancel()
	d, err := describe(dctx)
	if err != nil {
		return fmt.Errorf("describe, to check its version against %q: %w", constraint, err)
	}
	return CheckVersion(p.Kind, p.Name, d.Version, constraint)
}

// Probe is what starting a plugin briefly tells about it.
type Probe struct {
	Description plugin.Description
	// Protocol is the negotiated plugin protocol version.
	Protocol int
}

// Probe starts the plugin at loc (after the lock's check), asks for its
// Description and stops it, all within timeout.
func (h *Host) Probe(ctx context.Context, loc Located, timeout time.Duration) (Probe, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	p, err := h.start(ctx, loc)
	if err != nil {
		return Probe{}, err
	}
	var describe func(context.Context) (plugin.Description, error)
	switch loc.Kind {
	case Trainer:
		t, derr := plugin.DispenseTrainer(p.client)
		err = derr
		if err == nil {
			describe, p.stop = t.Describe, t.Shutdown
		}
	default:
		a, derr := plugin.DispenseAverager(p.client)
		err = derr
		if err == nil {
			describe, p.stop = a.Describe, a.Shutdown
		}
	}
	var out Probe
	if err == nil {
		out.Protocol = p.Protocol()
		out.Description, err = describe(ctx)
	}
	if serr := h.Stop(context.Background(), p); err == nil && serr != nil {
		err = serr
	}
	if err != nil {
		return out, fmt.Errorf("probe %s plugin %q (%s): %w", loc.Kind, loc.Name, loc.Path, err)
	}
	return out, nil
}

// SameVersion reports whether a and b name one version: equal as
// hashicorp/go-version versions ("1.2" and "1.2.0"), or as strings when
// either is not a version.
func SameVersion(a, b string) bool {
	va, errA := version.NewVersion(a)
	vb, errB := version.NewVersion(b)
	if errA != nil || errB != nil {
		return a == b
	}
	return va.Equal(vb)
}

// CheckProbe refuses a plugin the lock names when what it says of itself
// disagrees with what the lock accepted: another version than the
// package's, or a negotiated protocol the package did not list. A nil
// lock, or one that does not name the plugin, admits it.
func (l *Lock) CheckProbe(kind Kind, name string, p Probe) error {
	e, ok := l.Entry(kind, name)
	if !ok {
		return nil
	}
	if !SameVersion(e.Version, p.Description.Version) {
		return fmt.Errorf("%s plugin %q describes itself as version %q, but the plugin lock accepted it as version %s", kind, name, p.Description.Version, e.Version)
	}
	if len(e.Protocols) > 0 && !slices.Contains(e.Protocols, p.Protocol) {
		return fmt.Errorf("%s plugin %q speaks plugin protocol %d, which its package did not list (%v)", kind, name, p.Protocol, e.Protocols)
	}
	return nil
}
