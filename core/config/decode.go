package config

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-version"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
	"github.com/zclconf/go-cty/cty/gocty"

	"github.com/cohortdl/cohort/shared/mtls"
)

var fileSchema = &hcl.BodySchema{
	Blocks: []hcl.BlockHeaderSchema{
		{Type: "run"},
		{Type: "coordinator"},
		{Type: "worker"},
		{Type: "trainer", LabelNames: []string{"name"}},
		{Type: "averager", LabelNames: []string{"name"}},
	},
}

// key is one key of a core block: how its value lands in a Config (set,
// for the decoder) and how it is read back out (get, for the writer), so
// one line of coreKeys serves both.
type key struct {
	name string
	set  func(c *Config, a *hcl.Attribute) hcl.Diagnostics
	get  func(c *Config) (cty.Value, error)
}

// coreBlock is a core block, its keys and its sub-blocks.
type coreBlock struct {
	name   string
	keys   []key
	blocks []coreBlock
	// set, for a sub-block, says whether c has it: the writer leaves out
	// one that is not (nil: always written).
	set func(c *Config) bool
}

// coreKeys are the core blocks and their keys, in the default file's order.
var coreKeys = []coreBlock{
	{name: "run", keys: []key{
		value("ranks", func(c *Config) *int { return &c.Run.Ranks }),
		value("epochs", func(c *Config) *int { return &c.Run.Epochs }),
		value("seed", func(c *Config) *int64 { return &c.Run.Seed }),
		value("out", func(c *Config) *string { return &c.Run.Out }),
	}},
	{name: "coordinator", keys: []key{
		value("listen", func(c *Config) *string { return &c.Coordinator.Listen }),
		value("reduce_port", func(c *Config) *int { return &c.Coordinator.ReducePort }),
		value("http", func(c *Config) *string { return &c.Coordinator.HTTP }),
		duration("heartbeat_timeout", func(c *Config) *time.Duration { return &c.Coordinator.HeartbeatTimeout }),
		duration("formation_timeout", func(c *Config) *time.Duration { return &c.Coordinator.FormationTimeout }),
		value("policy", func(c *Config) *Policy { return &c.Coordinator.Policy }),
		value("sync_every", func(c *Config) *int { return &c.Coordinator.SyncEvery }),
		value("min_ranks", func(c *Config) *int { return &c.Coordinator.MinRanks }),
		value("checkpoint_every", func(c *Config) *int { return &c.Coordinator.CheckpointEvery }),
		value("checkpoint_keep", func(c *Config) *int { return &c.Coordinator.CheckpointKeep }),
		value("eval_rank", func(c *Config) *string { return &c.Coordinator.EvalRank }),
		value("eval_every", func(c *Config) *int { return &c.Coordinator.EvalEvery }),
		value("chunk_batches", func(c *Config) *int { return &c.Coordinator.ChunkBatches }),
		value("overhead_target", func(c *Config) *float64 { return &c.Coordinator.OverheadTarget }),
		value("easgd_alpha", func(c *Config) *float64 { return &c.Coordinator.EASGDAlpha }),
		value("async_overlap", func(c *Config) *bool { return &c.Coordinator.AsyncOverlap }),
		value("adaptive_sync", func(c *Config) *bool { return &c.Coordinator.AdaptiveSync }),
		value("sync_every_min", func(c *Config) *int { return &c.Coordinator.SyncEveryMin }),
		value("sync_every_max", func(c *Config) *int { return &c.Coordinator.SyncEveryMax }),
		value("divergence_target", func(c *Config) *float64 { return &c.Coordinator.DivergenceTarget }),
		value("guard_factor", func(c *Config) *float64 { return &c.Coordinator.GuardFactor }),
		value("guard_lr_factor", func(c *Config) *float64 { return &c.Coordinator.GuardLRFactor }),
		value("lr_plateau_patience", func(c *Config) *int { return &c.Coordinator.LRPlateauPatience }),
		value("lr_plateau_factor", func(c *Config) *float64 { return &c.Coordinator.LRPlateauFactor }),
		value("max_batch_diff", func(c *Config) *int { return &c.Coordinator.MaxBatchDiff }),
	}, blocks: []coreBlock{tlsBlock(func(c *Config) *mtls.Files { return &c.Coordinator.TLS })}},
	{name: "worker", keys: []key{
		duration("liveness_timeout", func(c *Config) *time.Duration { return &c.Worker.LivenessTimeout }),
		duration("connect_timeout", func(c *Config) *time.Duration { return &c.Worker.ConnectTimeout }),
		value("plugin_dir", func(c *Config) *string { return &c.Worker.PluginDir }),
		duration("shutdown_grace", func(c *Config) *time.Duration { return &c.Worker.ShutdownGrace }),
		value("plugin_lock", func(c *Config) *string { return &c.Worker.PluginLock }),
		value("plugin_restarts", func(c *Config) *int { return &c.Worker.PluginRestarts }),
	}, blocks: []coreBlock{tlsBlock(func(c *Config) *mtls.Files { return &c.Worker.TLS })}},
}

// tlsBlock is a tls sub-block: the PEM files of one side's mutual TLS.
func tlsBlock(field func(*Config) *mtls.Files) coreBlock {
	return coreBlock{name: "tls", keys: []key{
		path("ca", func(c *Config) *string { return &field(c).CA }),
		path("cert", func(c *Config) *string { return &field(c).Cert }),
		path("key", func(c *Config) *string { return &field(c).Key }),
	}, set: func(c *Config) bool { return field(c).Enabled() }}
}

// blockOf returns the core block named block.
func blockOf(block string) coreBlock {
	i := slices.IndexFunc(coreKeys, func(b coreBlock) bool { return b.name == block })
	return coreKeys[i]
}

// value is a key whose HCL value converts straight to the field's Go type.
func value[T any](name string, field func(*Config) *T) key {
	set := func(c *Config, a *hcl.Attribute) hcl.Diagnostics {
		return decodeValue(a, field(c))
	}
	get := func(c *Config) (cty.Value, error) {
		ty, err := gocty.ImpliedType(*field(c))
		if err != nil {
			return cty.NilVal, err
		}
		return gocty.ToCtyValue(*field(c), ty)
	}
	return key{name, set, get}
}

// decodeValue evaluates a's expression (literals only: there are no
// variables or functions) into *dst, converting as HCL does ("4" is a fine
// number); *dst is left alone on error.
func decodeValue[T any](a *hcl.Attribute, dst *T) hcl.Diagnostics {
	v, diags := eval(a)
	if diags.HasErrors() {
		return diags
	}
	var out T
	ty, err := gocty.ImpliedType(out)
	if err == nil {
		v, err = convert.Convert(v, ty)
	}
	if err == nil && v.IsNull() {
		err = errors.New("a value is required, not null")
	}
	if err == nil {
		err = gocty.FromCtyValue(v, &out)
	}
	if err != nil {
		return hcl.Diagnostics{{
			Severity: hcl.DiagError,
			Summary:  err.Error(),
			Subject:  a.NameRange.Ptr(),
		}}
	}
	*dst = out
	return nil
}

// duration is a key whose value is a Go duration string ("30s", "1m30s").
func duration(name string, field func(*Config) *time.Duration) key {
	set := func(c *Config, a *hcl.Attribute) hcl.Diagnostics {
		var s string
		if diags := decodeValue(a, &s); diags.HasErrors() {
			return diags
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			return hcl.Diagnostics{{
				Severity: hcl.DiagError,
				Summary:  fmt.Sprintf("%q is not a duration like \"30s\" or \"1m30s\"", s),
				Subject:  a.NameRange.Ptr(),
			}}
		}
		*field(c) = d
		return nil
	}
	get := func(c *Config) (cty.Value, error) {
		return cty.StringVal(field(c).String()), nil
	}
	return key{name, set, get}
}

// path is a key whose value is a file's path; a relative one is made
// absolute, beside the config file it is written in, so it names the same
// file wherever the run is started and in the copy `cohort run` writes.
func path(name string, field func(*Config) *string) key {
	set := func(c *Config, a *hcl.Attribute) hcl.Diagnostics {
		var s string
		if diags := decodeValue(a, &s); diags.HasErrors() {
			return diags
		}
		if s != "" && !filepath.IsAbs(s) {
			abs, err := filepath.Abs(filepath.Join(filepath.Dir(a.NameRange.Filename), s))
			if err != nil {
				return hcl.Diagnostics{{Severity: hcl.DiagError, Summary: fmt.Sprintf("%q: %v", s, err), Subject: a.NameRange.Ptr()}}
			}
			s = abs
		}
		*field(c) = s
		return nil
	}
	get := func(c *Config) (cty.Value, error) { return cty.StringVal(*field(c)), nil }
	return key{name, set, get}
}

// decode parses src and overlays what it sets onto c, recording where each
// key came from; parsed is false when src is not HCL. It does not
// validate.
func (c *Config) decode(src []byte, filename string) (parsed bool, err error) {
	var errs errList
	f, diags := hclsyntax.ParseConfig(src, filename, hcl.InitialPos)
	if diags.HasErrors() {
		errs.diags("", diags)
		return false, errs.err()
	}
	content, diags := f.Body.Content(fileSchema)
	errs.diags("", diags)
	first := map[string]*hcl.Block{}
	for _, b := range content.Blocks {
		if prev, dup := first[b.Type]; dup {
			errs.add(b.DefRange, b.Type, fmt.Sprintf(
				"a second %s block; the first is at %s, and a config has at most one", b.Type, prev.DefRange))
			continue
		}
		first[b.Type] = b
		switch b.Type {
		case "trainer":
			c.decodePlugin(b, &c.Trainer, &errs)
		case "averager":
			c.decodePlugin(b, &c.Averager, &errs)
		default:
			c.decodeCore(b, b.Type, blockOf(b.Type), &errs)
		}
	}
	return true, errs.err()
}

// decodeCore reads a core block (or sub-block) b, named by its path
// ("coordinator", "coordinator.tls"), whose schema is cb: its keys, then
// its sub-blocks, each at most once.
func (c *Config) decodeCore(b *hcl.Block, path string, cb coreBlock, errs *errList) {
	attrs, blocks, diags := attributesAndBlocks(b.Body)
	errs.diags(path, diags)
	known := make([]string, 0, len(cb.keys)+len(cb.blocks))
	for _, k := range cb.keys {
		known = append(known, k.name)
	}
	for _, sb := range cb.blocks {
		known = append(known, sb.name+" { }")
	}
	for _, a := range inOrder(attrs) {
		name := path + "." + a.Name
		i := slices.IndexFunc(cb.keys, func(k key) bool { return k.name == a.Name })
		if i < 0 {
			errs.add(a.NameRange, name, unknownKey(a.Name, path, known))
			continue
		}
		c.where[name] = a.NameRange
		errs.diags(name, cb.keys[i].set(c, a))
	}
	first := map[string]*hclsyntax.Block{}
	for _, sb := range blocks {
		name := path + "." + sb.Type
		i := slices.IndexFunc(cb.blocks, func(x coreBlock) bool { return x.name == sb.Type })
		switch prev, dup := first[sb.Type]; {
		case i < 0:
			errs.add(sb.TypeRange, path, fmt.Sprintf("Unexpected %q block; %s takes %s", sb.Type, path, strings.Join(known, ", ")))
		case dup:
			errs.add(sb.TypeRange, name, fmt.Sprintf("a second %s block; the first is at %s", sb.Type, prev.TypeRange))
		default:
			first[sb.Type] = sb
			c.where[name] = sb.TypeRange
			c.decodeCore(sb.AsHCLBlock(), name, cb.blocks[i], errs)
		}
	}
}

// attributesAndBlocks splits a body parsed by hclsyntax (as every config
// is) into its attributes and its blocks, in the file's order.
func attributesAndBlocks(body hcl.Body) (hcl.Attributes, hclsyntax.Blocks, hcl.Diagnostics) {
	sb, ok := body.(*hclsyntax.Body)
	if !ok {
		attrs, diags := body.JustAttributes()
		return attrs, nil, diags
	}
	attrs := make(hcl.Attributes, len(sb.Attributes))
	for name, a := range sb.Attributes {
		attrs[name] = a.AsHCLAttribute()
	}
	return attrs, sb.Blocks, nil
}

// VersionKey is the plugin block key the core takes for itself: a
// constraint on the plugin's version, never passed to the plugin.
const VersionKey = "version"

// decodePlugin reads a plugin block: its label is the plugin's name, its
// attributes but VersionKey, evaluated, become the settings object.
func (c *Config) decodePlugin(b *hcl.Block, p *Plugin, errs *errList) {
	if len(b.Labels) != 1 { // the schema has already reported it
		return
	}
	c.where[b.Type] = b.LabelRanges[0]
	attrs, diags := b.Body.JustAttributes()
	errs.diags(b.Type, diags)
	var constraint string
	if a, ok := attrs[VersionKey]; ok {
		delete(attrs, VersionKey)
		key := b.Type + "." + VersionKey
		c.where[key] = a.NameRange
		if diags := decodeValue(a, &constraint); diags.HasErrors() {
			errs.diags(key, diags)
		} else if _, err := version.NewConstraint(constraint); constraint != "" && err != nil {
			errs.add(a.NameRange, key, fmt.Sprintf("%q is not a version constraint like \">= 1.2, < 2\": %v", constraint, err))
		}
	}
	var buf bytes.Buffer
	buf.WriteByte('{')
	names := make([]string, 0, len(attrs))
	for name := range attrs {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		a := attrs[name]
		c.where[b.Type+"."+name] = a.NameRange // for CheckPluginSettings
		v, diags := eval(a)
		if diags.HasErrors() {
			errs.diags(b.Type+"."+name, diags)
			continue
		}
		if buf.Len() > 1 {
			buf.WriteByte(',')
		}
		writeString(&buf, name)
		buf.WriteByte(':')
		if err := writeJSON(&buf, v); err != nil {
			errs.add(a.NameRange, b.Type+"."+name, err.Error())
		}
	}
	buf.WriteByte('}')
	*p = Plugin{Name: b.Labels[0], Settings: buf.Bytes(), Version: constraint}
}

// inOrder returns attrs in the order they appear in the file.
func inOrder(attrs hcl.Attributes) []*hcl.Attribute {
	out := make([]*hcl.Attribute, 0, len(attrs))
	for _, a := range attrs {
		out = append(out, a)
	}
	slices.SortFunc(out, func(x, y *hcl.Attribute) int { return x.Range.Start.Byte - y.Range.Start.Byte })
	return out
}

// eval evaluates a's expression with no variables or functions. Numbers a
// float64 cannot hold are refused, as literals before evaluating (see
// inRange) and as results after.
func eval(a *hcl.Attribute) (cty.Value, hcl.Diagnostics) {
	rangeErr := func(r hcl.Range) hcl.Diagnostics {
		return hcl.Diagnostics{{Severity: hcl.DiagError, Summary: errRange.Error(), Subject: r.Ptr()}}
	}
	if node, ok := a.Expr.(hclsyntax.Node); ok {
		var diags hcl.Diagnostics
		hclsyntax.VisitAll(node, func(n hclsyntax.Node) hcl.Diagnostics {
			if lit, ok := n.(*hclsyntax.LiteralValueExpr); ok && !numberInRange(lit.Val) {
				diags = append(diags, rangeErr(lit.SrcRange)...)
			}
			return nil
		})
		if diags.HasErrors() {
			return cty.DynamicVal, diags
		}
	}
	v, diags := a.Expr.Value(nil)
	if diags.HasErrors() {
		return v, diags
	}
	bad := false
	_ = cty.Walk(v, func(_ cty.Path, x cty.Value) (bool, error) {
		bad = bad || !numberInRange(x)
		return !bad, nil
	})
	if bad {
		return cty.DynamicVal, rangeErr(a.Expr.Range())
	}
	return v, nil
}

// numberInRange is false only for a known number outside a float64's range.
func numberInRange(v cty.Value) bool {
	if v.IsMarked() || !v.IsKnown() || v.IsNull() || v.Type() != cty.Number {
		return true
	}
	return inRange(v.AsBigFloat())
}
