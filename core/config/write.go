package config

import (
	"fmt"

	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/hcl/v2/hclwrite"
	"github.com/zclconf/go-cty/cty"
	ctyjson "github.com/zclconf/go-cty/cty/json"
)

// HCL renders c as a config file that Parse reads back as c: every core key,
// from the same table the decoder reads, then the trainer and averager
// blocks with their settings. `cohort run` writes it for its workers, so
// what the launcher resolved (file, defaults, flags) is what they read.
func (c *Config) HCL() ([]byte, error) {
	f := hclwrite.NewEmptyFile()
	body := f.Body()
	for _, b := range coreKeys {
		if err := writeCore(c, body, b.name, b); err != nil {
			return nil, err
		}
		body.AppendNewline()
	}
	for _, p := range []struct {
		kind string
		Plugin
	}{{"trainer", c.Trainer}, {"averager", c.Averager}} {
		block := body.AppendNewBlock(p.kind, []string{p.Name}).Body()
		if p.Version != "" {
			block.SetAttributeValue(VersionKey, cty.StringVal(p.Version))
		}
		if err := writeSettings(block, p.Settings); err != nil {
			return nil, fmt.Errorf("config: write %s %q: %w", p.kind, p.Name, err)
		}
		body.AppendNewline()
	}
	return hclwrite.Format(f.Bytes()), nil
}

// writeCore writes block b (at path, for errors) and the sub-blocks c has.
func writeCore(c *Config, body *hclwrite.Body, path string, b coreBlock) error {
	block := body.AppendNewBlock(b.name, nil).Body()
	for _, k := range b.keys {
		v, err := k.get(c)
		if err != nil {
			return fmt.Errorf("config: write %s.%s: %w", path, k.name, err)
		}
		block.SetAttributeValue(k.name, v)
	}
	for _, sb := range b.blocks {
		if sb.set == nil || sb.set(c) {
			if err := writeCore(c, block, path+"."+sb.name, sb); err != nil {
				return err
			}
		}
	}
	return nil
}

// writeSettings writes a plugin's settings, a JSON object, as the block's
// attributes. Numbers keep every digit: cty reads JSON numbers as big
// floats and writes them back out in full.
func writeSettings(block *hclwrite.Body, settings []byte) error {
	ty, err := ctyjson.ImpliedType(settings)
	if err != nil {
		return fmt.Errorf("settings %s: %w", settings, err)
	}
	if !ty.IsObjectType() {
		return fmt.Errorf("settings %s are not a JSON object", settings)
	}
	v, err := ctyjson.Unmarshal(settings, ty)
	if err != nil {
		return fmt.Errorf("settings %s: %w", settings, err)
	}
	for it := v.ElementIterator(); it.Next(); { // names come sorted
		name, val := it.Element()
		if !hclsyntax.ValidIdentifier(name.AsString()) {
			return fmt.Errorf("setting %q is not an HCL attribute name", name.AsString())
		}
		block.SetAttributeValue(name.AsString(), val)
	}
	return nil
}
