package plugin

import "github.com/hashicorp/go-hclog"

// relogger is the logger go-plugin re-emits a plugin's log lines through.
// go-plugin names it after the binary (on top of the host's name for the
// plugin) and adds to each line the plugin's own timestamp and @module,
// the plugin's logger name: the host logger's line already carries a time
// and says which plugin it is, so relogger keeps the host's name and drops
// those two keys.
type relogger struct {
	hclog.Logger
}

func newRelogger(l hclog.Logger) hclog.Logger { return relogger{l} }

// Named keeps the host's name: go-plugin names its stderr logger after the
// binary, which the host's name already stands for.
func (r relogger) Named(string) hclog.Logger { return r }

func (r relogger) With(args ...any) hclog.Logger { return relogger{r.Logger.With(dropped(args)...)} }

func (r relogger) Log(level hclog.Level, msg string, args ...any) {
	r.Logger.Log(level, msg, dropped(args)...)
}
func (r relogger) Trace(msg string, args ...any) { r.Logger.Trace(msg, dropped(args)...) }
func (r relogger) Debug(msg string, args ...any) { r.Logger.Debug(msg, dropped(args)...) }
func (r relogger) Info(msg string, args ...any)  { r.Logger.Info(msg, dropped(args)...) }
func (r relogger) Warn(msg string, args ...any)  { r.Logger.Warn(msg, dropped(args)...) }
func (r relogger) Error(msg string, args ...any) { r.Logger.Error(msg, dropped(args)...) }

// dropped is args, key-value pairs, without the keys go-plugin adds from
// the plugin's own JSON line.
func dropped(args []any) []any {
	out := args[:0:0]
	for i := 0; i < len(args); i += 2 {
		if k, ok := args[i].(string); ok && (k == "timestamp" || k == "@module") && i+1 < len(args) {
			continue
		}
		out = append(out, args[i:min(i+2, len(args))]...)
	}
	return out
}
