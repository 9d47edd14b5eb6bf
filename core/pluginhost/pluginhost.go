// Package pluginhost finds, verifies, launches and stops a rank's plugins.
//
// A plugin is chosen by kind and name only (the config file's
// `trainer "NAME"` and `averager "NAME"` blocks): the binary
// cohort-trainer-NAME or cohort-averaging-NAME is looked up in the plugin
// directories, then on PATH; when the directory holding it has a SHA256SUMS
// file the binary must be listed there and match, and go-plugin checks it
// again before it runs. A lock file (lock.go), written when a signed
// package is installed, pins a plugin's binary to the checksum accepted
// then. Once started, a plugin's own version (its Describe) must satisfy
// the config's constraint for it. Stopping asks the plugin to shut down
// through its own Shutdown RPC first and kills it only after a grace
// period. The package also owns the SHA256SUMS and lock file formats.
package pluginhost

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"

	"github.com/cohortdl/cohort/shared/plugin"
)

// Kind is a plugin contract.
type Kind string

// The two kinds a rank runs.
const (
	Trainer  Kind = plugin.KindTrainer
	Averager Kind = plugin.KindAverager
)

// SumsFile is the checksum list a plugin directory may hold, in the format
// sha256sum writes.
const SumsFile = "SHA256SUMS"

// BinaryName is the executable that serves plugin name of kind.
func BinaryName(kind Kind, name string) string {
	if kind == Averager {
		return "cohort-averaging-" + name
	}
	return "cohort-trainer-" + name
}

// Located is a plugin binary found on disk.
type Located struct {
	Kind Kind
	Name string
	Path string
	// Checksum is the SHA-256 the SHA256SUMS file beside it lists; nil when
	// the directory has no such file.
	Checksum []byte
}

// Find looks for the plugin in dirs, in order, then on PATH, and reads the
// checksum that the directory's SHA256SUMS lists for it.
func Find(dirs []string, kind Kind, name string) (Located, error) {
	if name == "" || strings.ContainsAny(name, `/\`) {
		return Located{}, fmt.Errorf("find %s plugin: invalid name %q", kind, name)
	}
	bin := BinaryName(kind, name)
	var path string
	// broken says why a directory that should hold the plugin cannot run
	// it, so a missing or unexecutable file is told from a plugin never
	// installed.
	var broken []string
	for _, d := range dirs {
		if d == "" {
			continue
		}
		p := filepath.Join(d, bin)
		st, err := os.Stat(p)
		switch {
		case err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0:
			path = p
		case err == nil && st.Mode().IsRegular():
			broken = append(broken, fmt.Sprintf("%s is not executable (mode %v)", p, st.Mode().Perm()))
		case errors.Is(err, os.ErrNotExist):
			if sum, _ := listedChecksum(filepath.Join(d, SumsFile), bin); sum != nil {
				broken = append(broken, fmt.Sprintf("%s lists %s, but the file is missing", filepath.Join(d, SumsFile), bin))
			}
		}
		if path != "" {
			break
		}
	}
	if path == "" {
		p, err := exec.LookPath(bin)
		switch {
		case err != nil && len(broken) > 0:
			return Located{}, fmt.Errorf("find %s plugin %q: its executable is missing: %s (rebuild or reinstall it)", kind, name, strings.Join(broken, "; "))
		case err != nil:
			return Located{}, fmt.Errorf("find %s plugin %q: no executable %s in %s or on PATH", kind, name, bin, strings.Join(dirs, ", "))
		}
		path = p
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return Located{}, fmt.Errorf("find %s plugin %q: %w", kind, name, err)
	}
	loc := Located{Kind: kind, Name: name, Path: abs}
	sum, err := listedChecksum(filepath.Join(filepath.Dir(abs), SumsFile), bin)
	if err != nil {
		return Located{}, fmt.Errorf("find %s plugin %q: %w", kind, name, err)
	}
	loc.Checksum = sum
	return loc, nil
}

// Listing is one plugin binary found by List.
type Listing struct {
	Located
	// Err says why the plugin would be refused (an unlisted or malformed
	// SHA256SUMS entry, or a binary that does not match it); nil when it
	// would run.
	Err error
}

// List finds every plugin binary in dirs, then on PATH, in Find's order:
// where a name stands twice, the first one found is the one Find picks and
// the only one listed.
func List(dirs []string) []Listing {
	var out []Listing
	seen := map[string]bool{}
	search := append(slices.Clone(dirs), filepath.SplitList(os.Getenv("PATH"))...)
	for _, d := range search {
		ents, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range ents {
			kind, name, ok := parseBinaryName(e.Name())
			if !ok || seen[e.Name()] {
				continue
			}
			p := filepath.Join(d, e.Name())
			if st, err := os.Stat(p); err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
				continue
			}
			seen[e.Name()] = true
			l := Listing{Located: Located{Kind: kind, Name: name, Path: p}}
			l.Checksum, l.Err = listedChecksum(filepath.Join(d, SumsFile), e.Name())
			if l.Err == nil && l.Checksum != nil {
				l.Err = verify(p, l.Checksum)
			}
			out = append(out, l)
		}
	}
	return out
}

func parseBinaryName(file string) (Kind, string, bool) {
	if name, ok := strings.CutPrefix(file, BinaryName(Trainer, "")); ok && name != "" {
		return Trainer, name, true
	}
	if name, ok := strings.CutPrefix(file, BinaryName(Averager, "")); ok && name != "" {
		return Averager, name, true
	}
	return "", "", false
}

// verify checks path against its listed SHA-256, as go-plugin will before
// running it.
func verify(path string, sum []byte) error {
	got, err := fileSHA256(path)
	if err != nil {
		return err
	}
	if !bytes.Equal(got, sum) {
		return fmt.Errorf("%s does not match its %s entry", path, SumsFile)
	}
	return nil
}

// listedChecksum returns bin's checksum from a SHA256SUMS file, nil when the
// file does not exist, and an error when it exists but does not list bin or
// is malformed.
func listedChecksum(sums, bin string) ([]byte, error) {
	f, err := os.Open(sums)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		hexsum, file, ok := strings.Cut(text, " ")
		if !ok {
			return nil, fmt.Errorf("%s:%d: want \"<sha256> <file>\"", sums, line)
		}
		file = strings.TrimPrefix(strings.TrimSpace(file), "*")
		if filepath.Base(file) != bin {
			continue
		}
		sum, err := hex.DecodeString(hexsum)
		if err != nil || len(sum) != sha256.Size {
			return nil, fmt.Errorf("%s:%d: %q is not a SHA-256", sums, line, hexsum)
		}
		return sum, nil
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", sums, err)
	}
	return nil, fmt.Errorf("%s does not list %s: refusing to run an unlisted plugin", sums, bin)
}

// Options configure a Host.
type Options struct {
	// Dirs are searched before PATH.
	Dirs   []string
	Logger hclog.Logger
	// Grace is how long Stop waits for the plugin's Shutdown RPC before it
	// kills the process.
	Grace time.Duration
	// StartTimeout bounds the go-plugin handshake (default
	// DefaultStartTimeout).
	StartTimeout time.Duration
	// Env is added to the plugin's environment. The host's own environment
	// is passed on without variables named in Withhold.
	Env []string
	// Withhold names environment variables plugins must not see (the run
	// secret's, for one).
	Withhold []string
	// Lock is the plugin lock file's path (see LoadLock); empty or a
	// missing file locks nothing.
	Lock string
	// Versions constrain each kind's plugin version (go-version syntax,
	// ">= 1.2, < 2"); a plugin whose Describe reports a version outside
	// its kind's constraint is stopped and refused before it is used.
	Versions map[Kind]string
}

// DefaultStartTimeout bounds a plugin's handshake when Options leave it
// out: long enough for a plugin's factory, which runs first (loading
// libtorch took over 10 s on a 2-core machine busy with other runs), and
// short enough that a binary that is not a cohort plugin, and never
// answers, is refused within the minute.
const DefaultStartTimeout = 30 * time.Second

// Host launches plugins and stops every one of them.
type Host struct {
	opts Options

	mu      sync.Mutex
	running []*Process
}

// New makes a Host; zero options get defaults.
func New(o Options) *Host {
	if o.Logger == nil {
		o.Logger = hclog.NewNullLogger()
	}
	if o.Grace <= 0 {
		o.Grace = 5 * time.Second
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = DefaultStartTimeout
	}
	return &Host{opts: o}
}

// Process is one running plugin.
type Process struct {
	Located
	client *goplugin.Client
	stopMu sync.Mutex
	stop   func(context.Context) error
	done   bool
}

// Pid is the plugin's process id, or 0 once it has exited.
func (p *Process) Pid() int {
	if rc := p.client.ReattachConfig(); rc != nil {
		return rc.Pid
	}
	return 0
}

// Exited reports whether the plugin process has ended.
func (p *Process) Exited() bool { return p.client.Exited() }

// StartTrainer finds and launches the trainer plugin name.
func (h *Host) StartTrainer(ctx context.Context, name string) (plugin.Trainer, *Process, error) {
	p, err := h.launch(ctx, Trainer, name)
	if err != nil {
		return nil, nil, err
	}
	t, err := plugin.DispenseTrainer(p.client)
	if err == nil {
		err = h.checkVersion(ctx, p, t.Describe)
	}
	if err != nil {
		plugin.Kill(p.client)
		return nil, nil, fmt.Errorf("trainer plugin %q (%s): %w", name, p.Path, err)
	}
	p.stop = t.Shutdown
	h.track(p)
	return t, p, nil
}

// StartAverager finds and launches the averaging plugin name.
func (h *Host) StartAverager(ctx context.Context, name string) (plugin.Averager, *Process, error) {
	p, err := h.launch(ctx, Averager, name)
	if err != nil {
		return nil, nil, err
	}
	a, err := plugin.DispenseAverager(p.client)
	if err == nil {
		err = h.checkVersion(ctx, p, a.Describe)
	}
	if err != nil {
		plugin.Kill(p.client)
		return nil, nil, fmt.Errorf("averaging plugin %q (%s): %w", name, p.Path, err)
	}
	p.stop = a.Shutdown
	h.track(p)
	return a, p, nil
}

func (h *Host) track(p *Process) {
	h.mu.Lock()
	h.running = append(h.running, p)
	h.mu.Unlock()
}

func (h *Host) launch(ctx context.Context, kind Kind, name string) (*Process, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	loc, err := Find(h.opts.Dirs, kind, name)
	if err != nil {
		return nil, err
	}
	return h.start(ctx, loc)
}

// start launches the plugin at loc, after checking it against the lock.
func (h *Host) start(ctx context.Context, loc Located) (*Process, error) {
	kind, name := loc.Kind, loc.Name
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	lock, err := LoadLock(h.opts.Lock)
	if err != nil {
		return nil, fmt.Errorf("%s plugin %q: %w", kind, name, err)
	}
	locked, err := lock.checkLocked(loc)
	if err != nil {
		return nil, err
	}
	if loc.Checksum == nil {
		loc.Checksum = locked
	}
	cmd := exec.Command(loc.Path)
	cmd.Env = h.env()
	// The kernel kills the plugin with the host where it can; the plugin
	// also watches its parent, as this tracks only the spawning thread.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var secure *goplugin.SecureConfig
	if loc.Checksum != nil {
		secure = &goplugin.SecureConfig{Checksum: loc.Checksum, Hash: sha256.New()}
	}
	cfg := plugin.ClientConfig(plugin.ClientOptions{
		Cmd:          cmd,
		Logger:       h.pluginLogger(kind),
		SecureConfig: secure,
		StartTimeout: h.opts.StartTimeout,
	})
	cfg.SkipHostEnv = true
	stderr := &stderrTail{}
	cfg.Stderr = stderr
	client := goplugin.NewClient(cfg)
	if _, err := client.Start(); err != nil {
		plugin.Kill(client)
		if errors.Is(err, goplugin.ErrChecksumsDoNotMatch) {
			return nil, fmt.Errorf("%s plugin %q: %s does not match its SHA256SUMS entry: %w", kind, name, loc.Path, err)
		}
		err = plugin.ExplainStart(filepath.Base(loc.Path), err)
		if tail := stderr.String(); tail != "" {
			err = fmt.Errorf("%w; its stderr:\n%s", err, tail)
		}
		return nil, fmt.Errorf("start %s plugin %q (%s): %w", kind, name, loc.Path, err)
	}
	return &Process{Located: loc, client: client}, nil
}

// pluginLogger is the logger a plugin's lines go to: the host's name and
// the kind, short ("rank 2 trainer"), as every line of a plugin repeats it.
func (h *Host) pluginLogger(kind Kind) hclog.Logger {
	name := string(kind)
	if host := h.opts.Logger.Name(); host != "" {
		name = host + " " + name
	}
	return h.opts.Logger.ResetNamed(name)
}

func (h *Host) env() []string {
	out := make([]string, 0, len(os.Environ())+len(h.opts.Env))
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		withheld := false
		for _, w := range h.opts.Withhold {
			if k == w {
				withheld = true
				break
			}
		}
		if !withheld {
			out = append(out, kv)
		}
	}
	// The plugin logs at the rank's level (-v raises it), so its debug
	// lines are there when the rank's are; an explicit setting wins.
	if _, set := os.LookupEnv(plugin.LogLevelEnv); !set && h.opts.Logger != nil {
		if lv := h.opts.Logger.GetLevel(); lv != hclog.NoLevel {
			out = append(out, plugin.LogLevelEnv+"="+lv.String())
		}
	}
	return append(out, h.opts.Env...)
}

// Stop asks p to shut down through its Shutdown RPC, waits up to the grace
// period, then kills it. It is idempotent.
func (h *Host) Stop(ctx context.Context, p *Process) error {
	p.stopMu.Lock()
	defer p.stopMu.Unlock()
	if p.done {
		return nil
	}
	p.done = true
	var err error
	if p.stop != nil && !p.client.Exited() {
		sctx, cancel := context.WithTimeout(ctx, h.opts.Grace)
		err = p.stop(sctx)
		cancel()
		if err != nil {
			err = fmt.Errorf("shut down %s plugin %q: %w", p.Kind, p.Name, err)
		}
	}
	pid := p.Pid()
	if err != nil && pid > 0 {
		// go-plugin's Kill first asks the plugin to close over gRPC with no
		// deadline, which never returns from a wedged plugin: kill it first.
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	// A plugin can also wedge after answering Shutdown (seen once in CI:
	// a frozen plugin whose Kill hung though its Shutdown had been
	// answered), so Kill gets the grace period too before the process is
	// killed under it, which ends Kill's wait on the dead connection.
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		// plugin.Kill also removes the socket a killed plugin leaves.
		plugin.Kill(p.client)
	}()
	select {
	case <-killed:
	case <-time.After(h.opts.Grace):
		if pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		<-killed
		if err == nil {
			err = fmt.Errorf("stop %s plugin %q: it did not exit within %v of Shutdown; killed", p.Kind, p.Name, h.opts.Grace)
		}
	}
	return err
}

// StopAll stops every plugin this host started, in reverse start order, and
// returns every error.
func (h *Host) StopAll(ctx context.Context) error {
	h.mu.Lock()
	procs := h.running
	h.running = nil
	h.mu.Unlock()
	var errs []error
	for i := len(procs) - 1; i >= 0; i-- {
		errs = append(errs, h.Stop(ctx, procs[i]))
	}
	return errors.Join(errs...)
}
