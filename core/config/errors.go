package config

import (
	"cmp"
	"errors"
	"slices"
	"strings"

	"github.com/hashicorp/hcl/v2"
)

// Error is one problem with a configuration: where it is, which key, what.
type Error struct {
	// Range is where the offending text is. A value that came from no line
	// (a default, a command-line flag) has only a Filename: the config's
	// Path, or the flag's name ("--ranks").
	Range hcl.Range
	// Key is the key at fault, "block.key" ("coordinator.policy"), or the
	// block type for a block-level problem; empty for a syntax error.
	Key string
	Msg string
}

// Error reads `file:line,col-col: key: message`.
func (e *Error) Error() string {
	var b strings.Builder
	switch {
	case e.Range.Start.Line > 0:
		b.WriteString(e.Range.String())
		b.WriteString(": ")
	case e.Range.Filename != "":
		b.WriteString(e.Range.Filename)
		b.WriteString(": ")
	}
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// errList collects problems.
type errList []*Error

func (l *errList) add(r hcl.Range, key, msg string) {
	*l = append(*l, &Error{Range: r, Key: key, Msg: msg})
}

// diags adds the error diagnostics among ds, each under key.
func (l *errList) diags(key string, ds hcl.Diagnostics) {
	for _, d := range ds {
		if d.Severity != hcl.DiagError {
			continue
		}
		e := &Error{Key: key, Msg: d.Summary}
		if d.Detail != "" {
			e.Msg += "; " + d.Detail
		}
		if d.Subject != nil {
			e.Range = *d.Subject
		}
		*l = append(*l, e)
	}
}

// err returns the problems in the order of the source, those with no line
// last, as one error; nil if there are none.
func (l errList) err() error {
	slices.SortStableFunc(l, func(a, b *Error) int {
		pa, pb := a.Range.Start, b.Range.Start
		if (pa.Line == 0) != (pb.Line == 0) {
			return cmp.Compare(pb.Line, pa.Line) // a line sorts before none
		}
		return cmp.Or(cmp.Compare(pa.Line, pb.Line), cmp.Compare(pa.Column, pb.Column))
	})
	errs := make([]error, len(l))
	for i, e := range l {
		errs[i] = e
	}
	return errors.Join(errs...)
}
