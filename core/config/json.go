package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"math/big"
	"strconv"

	"github.com/zclconf/go-cty/cty"
)

// writeJSON appends v as JSON. It does what cty's own JSON encoding does for
// plain values (objects and maps become objects with sorted keys; lists,
// sets and tuples become arrays) but refuses numbers a plugin could not
// read as a float64, which cty would spell out in full: 1e999999 is a
// million digits.
func writeJSON(b *bytes.Buffer, v cty.Value) error {
	switch {
	case v.IsMarked():
		return errors.New("value is marked and cannot be passed to a plugin")
	case !v.IsKnown():
		return errors.New("value is not known")
	case v.IsNull():
		b.WriteString("null")
		return nil
	}
	t := v.Type()
	switch {
	case t == cty.String:
		writeString(b, v.AsString())
	case t == cty.Bool:
		b.WriteString(strconv.FormatBool(v.True()))
	case t == cty.Number:
		s, err := formatNumber(v.AsBigFloat())
		if err != nil {
			return err
		}
		b.WriteString(s)
	case t.IsListType(), t.IsSetType(), t.IsTupleType():
		b.WriteByte('[')
		for i, it := 0, v.ElementIterator(); it.Next(); i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			_, ev := it.Element()
			if err := writeJSON(b, ev); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case t.IsMapType(), t.IsObjectType():
		b.WriteByte('{')
		for i, it := 0, v.ElementIterator(); it.Next(); i++ { // keys come sorted
			if i > 0 {
				b.WriteByte(',')
			}
			ek, ev := it.Element()
			writeString(b, ek.AsString())
			b.WriteByte(':')
			if err := writeJSON(b, ev); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		return errors.New("a " + t.FriendlyName() + " cannot be passed to a plugin")
	}
	return nil
}

// errRange refuses a number a float64 cannot hold.
var errRange = errors.New("number is out of a float64's range")

// inRange reports whether f is finite and neither too large nor too small
// (apart from zero) for a float64. Numbers outside are refused before
// anything is done with them: cty keeps numbers as big.Float, and spelling
// out 1e600000000, or taking its integer part for a %, takes minutes and
// gigabytes.
func inRange(f *big.Float) bool {
	x, _ := f.Float64()
	return !math.IsInf(x, 0) && (x != 0 || f.Sign() == 0)
}

// formatNumber writes integers exactly and other numbers as the shortest
// decimal that reads back as the same float64.
func formatNumber(f *big.Float) (string, error) {
	if !inRange(f) {
		return "", errRange
	}
	x, _ := f.Float64()
	if f.IsInt() {
		return f.Text('f', 0), nil
	}
	return strconv.FormatFloat(x, 'g', -1, 64), nil
}

// writeString appends s as a JSON string, leaving <, > and & as they are.
func writeString(b *bytes.Buffer, s string) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)       // a string always encodes
	b.Truncate(b.Len() - 1) // Encode's newline
}
