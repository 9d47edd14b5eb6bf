package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cohortdl/cohort/core/config"
	"github.com/cohortdl/cohort/core/pluginhost"
	"github.com/cohortdl/cohort/shared/plugin"
)

func newValidateCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "validate [FILE]",
		Short: "Check a config file and its plugins before a run, reporting every error",
		Long: `Checks a config file (FILE, or --config's) as a run would before any rank
starts, and reports every mistake in one pass, each with its file, line and
key: the core's keys (unknown, of the wrong type, out of range), that the
trainer and averager plugins are found (in worker.plugin_dir, the plugins
directory beside the cohort binary, then PATH) and pass their SHA256SUMS
and lock checks, that each completes the plugin handshake, that its version
satisfies the block's version constraint, and that the block's settings fit
the schema the plugin declares (each key known, of its type, the required
ones set). Exit status 0 means the file would run; 2 that it would not.

With -json it prints one JSON object: file, valid, trainer, averager, and
problems, each with file, line, column, key and message (line and column
are absent for a problem with no place in the file).`,
		Example: `  cohort validate cohort.hcl
  cohort validate --config cohort.hcl -json`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usageError("validate takes one config file, got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			file := g.configPath
			if len(args) == 1 {
				if file != "" && file != args[0] {
					return usageError("two config files, %s and --config %s: validate checks one", args[0], file)
				}
				file = args[0]
			}
			if file == "" {
				return usageError("no config file: cohort validate FILE, or --config FILE")
			}
			rep := validateFile(cmd.Context(), file)
			if asJSON {
				if err := rep.writeJSON(cmd.OutOrStdout()); err != nil {
					return failed(err)
				}
				if !rep.Valid {
					return &exitError{code: exitUsage}
				}
				return nil
			}
			if !rep.Valid {
				return configError(fmt.Errorf("%s is not valid: %s\n%s", file, count(len(rep.Problems), "mistake"), rep.text()))
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: ok (trainer %q, averager %q)\n", file, rep.Trainer, rep.Averager)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}

// validation is what `cohort validate` found in one file.
type validation struct {
	File     string    `json:"file"`
	Valid    bool      `json:"valid"`
	Trainer  string    `json:"trainer,omitempty"`
	Averager string    `json:"averager,omitempty"`
	Problems []problem `json:"problems"`
}

// problem is one mistake: where, which key, what.
type problem struct {
	File    string `json:"file"`
	Line    int    `json:"line,omitempty"`
	Column  int    `json:"column,omitempty"`
	Key     string `json:"key,omitempty"`
	Message string `json:"message"`
	text    string // as the error prints it
}

// validateFile runs every check on the config file at path and returns
// all it found, in the order of the file (problems with no line last).
func validateFile(ctx context.Context, path string) *validation {
	v := &validation{File: path, Problems: []problem{}}
	cfg, err := config.LoadUnchecked(path)
	errs := []error{err}
	if cfg != nil {
		v.Trainer, v.Averager = cfg.Trainer.Name, cfg.Averager.Name
		errs = append(errs, validate(ctx, cfg)...)
	}
	for _, e := range leaves(errs...) {
		p := problem{File: path, Message: e.Error(), text: e.Error()}
		var ce *config.Error
		if errors.As(e, &ce) {
			p.File = cmp.Or(ce.Range.Filename, path)
			p.Line, p.Column = ce.Range.Start.Line, ce.Range.Start.Column
			p.Key, p.Message = ce.Key, ce.Msg
		}
		v.Problems = append(v.Problems, p)
	}
	slices.SortStableFunc(v.Problems, func(a, b problem) int {
		if (a.Line == 0) != (b.Line == 0) {
			return cmp.Compare(b.Line, a.Line) // a line sorts before none
		}
		return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column))
	})
	v.Valid = len(v.Problems) == 0
	return v
}

// leaves flattens errors.Join's trees into their single errors, dropping
// nils.
func leaves(errs ...error) []error {
	var out []error
	for _, err := range errs {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			out = append(out, leaves(j.Unwrap()...)...)
		} else if err != nil {
			out = append(out, err)
		}
	}
	return out
}

func (v *validation) text() string {
	lines := make([]string, len(v.Problems))
	for i, p := range v.Problems {
		lines[i] = p.text
	}
	return strings.Join(lines, "\n")
}

func (v *validation) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// validate runs every check of a loaded config and returns each failure.
func validate(ctx context.Context, cfg *config.Config) []error {
	var errs []error
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	return append(errs, checkPlugins(ctx, cfg)...)
}

// checkPlugins starts the configured trainer and averager briefly, as a
// worker would, and returns each failure: not found, refused by its
// checksums or lock, no handshake, a version outside the block's
// constraint, or settings its declared schema refuses. Each names the
// file and line of the block (or key) at fault.
func checkPlugins(ctx context.Context, cfg *config.Config) []error {
	if ctx == nil {
		ctx = context.Background()
	}
	h := pluginhost.New(pluginhost.Options{
		Dirs:     pluginDirs(cfg),
		Withhold: []string{envSecret, envSecretFile},
		Lock:     cfg.Worker.PluginLock,
		Versions: map[pluginhost.Kind]string{
			pluginhost.Trainer:  cfg.Trainer.Version,
			pluginhost.Averager: cfg.Averager.Version,
		},
	})
	defer h.StopAll(context.Background())
	var errs []error
	check := func(kind string, settings []byte, p interface {
		Describe(context.Context) (plugin.Description, error)
	}, err error) {
		if err != nil {
			errs = append(errs, cfg.ErrorAt(kind, err))
			return
		}
		d, err := p.Describe(ctx)
		if err != nil {
			errs = append(errs, cfg.ErrorAt(kind, err))
			return
		}
		if err := cfg.CheckPluginSettings(kind, d.Settings); err != nil {
			// Values of the wrong type or keys it does not take: its own
			// check would only repeat them.
			errs = append(errs, err)
			return
		}
		errs = append(errs, pluginSettingsCheck(ctx, cfg, kind, settings, p)...)
	}
	t, _, err := h.StartTrainer(ctx, cfg.Trainer.Name)
	check(plugin.KindTrainer, cfg.Trainer.Settings, t, err)
	a, _, err := h.StartAverager(ctx, cfg.Averager.Name)
	check(plugin.KindAverager, cfg.Averager.Settings, a, err)
	return errs
}

// pluginSettingsCheck asks p, the started plugin of kind, to check its
// block's settings as it would configure with them (SettingsChecker),
// and returns each value it refuses at the line of its key.
func pluginSettingsCheck(ctx context.Context, cfg *config.Config, kind string, settings []byte, p any) []error {
	c, ok := p.(plugin.SettingsChecker)
	if !ok {
		return nil
	}
	problems, err := c.CheckSettings(ctx, settings)
	if err != nil {
		return []error{cfg.ErrorAt(kind, err)}
	}
	var errs []error
	for _, pr := range problems {
		e := cfg.ErrorAt(kind+"."+pr.Key, errors.New(pr.Message))
		if pr.Key == "" || e.Range.Start.Line == 0 {
			// The block's own line: the key is not in the file.
			e = cfg.ErrorAt(kind, errors.New(pr.Message))
		}
		errs = append(errs, e)
	}
	return errs
}
