package dataset

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// maxNPYHeader bounds a .npy header; numpy writes well under a kilobyte.
const maxNPYHeader = 1 << 20

const npyMagic = "\x93NUMPY"

// decodeNPY decodes a NumPy .npy stream (format versions 1 to 3) of a plain
// numeric dtype in C order; known is the stream's length when known, or -1.
func decodeNPY(r io.Reader, known int64) (*array, error) {
	var pre [8]byte
	if _, err := io.ReadFull(r, pre[:]); err != nil {
		return nil, fmt.Errorf("not a .npy file: preamble unreadable: %v", err)
	}
	if string(pre[:6]) != npyMagic {
		return nil, fmt.Errorf("not a .npy file: magic %q (want \\x93NUMPY)", pre[:6])
	}
	major := pre[6]
	var hlen uint64
	used := int64(8)
	switch major {
	case 1:
		var b [2]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return nil, fmt.Errorf(".npy header length truncated: %v", err)
		}
		hlen, used = uint64(binary.LittleEndian.Uint16(b[:])), used+2
	case 2, 3:
		var b [4]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return nil, fmt.Errorf(".npy header length truncated: %v", err)
		}
		hlen, used = uint64(binary.LittleEndian.Uint32(b[:])), used+4
	default:
		return nil, fmt.Errorf(".npy format version %d.%d; this reader knows 1.0 to 3.0", major, pre[7])
	}
	if hlen > maxNPYHeader {
		return nil, fmt.Errorf(".npy header of %d bytes exceeds the limit of %d", hlen, maxNPYHeader)
	}
	if known >= 0 && known-used < int64(hlen) {
		return nil, fmt.Errorf("truncated .npy: header of %d bytes, the file holds %d after the preamble", hlen, known-used)
	}
	head := make([]byte, hlen)
	if _, err := io.ReadFull(r, head); err != nil {
		return nil, fmt.Errorf("truncated .npy: header of %d bytes unreadable: %v", hlen, err)
	}
	used += int64(hlen)
	h, err := parseNPYHeader(string(head))
	if err != nil {
		return nil, fmt.Errorf(".npy header %q: %w", strings.TrimSpace(string(head)), err)
	}
	n, err := payloadSize(h.shape, h.kind.size())
	if err != nil {
		return nil, fmt.Errorf(".npy: %w", err)
	}
	if known >= 0 {
		known -= used
	}
	raw, err := readPayload(r, n, known)
	if err != nil {
		return nil, fmt.Errorf(".npy %s %v: %w", h.descr, h.shape, err)
	}
	a := &array{kind: h.kind, bigEndian: h.bigEndian, raw: raw, shape: make([]int, len(h.shape))}
	for i, d := range h.shape {
		a.shape[i] = int(d)
	}
	return a, nil
}

type npyHeader struct {
	descr     string
	kind      elemKind
	bigEndian bool
	shape     []uint64
}

// parseNPYHeader reads the header's Python dict literal: 'descr' (a dtype
// string), 'fortran_order' (a bool) and 'shape' (a tuple of integers).
func parseNPYHeader(s string) (npyHeader, error) {
	p := &pyLexer{s: s}
	var h npyHeader
	if err := p.expect('{'); err != nil {
		return h, err
	}
	seen := map[string]bool{}
	fortran := false
	for {
		if p.peek() == '}' {
			p.pos++
			break
		}
		key, err := p.str()
		if err != nil {
			return h, err
		}
		if seen[key] {
			return h, fmt.Errorf("key %q twice", key)
		}
		seen[key] = true
		if err := p.expect(':'); err != nil {
			return h, err
		}
		switch key {
		case "descr":
			if p.peek() == '[' {
				return h, errors.New("structured dtypes are not supported; save a plain numeric array")
			}
			if h.descr, err = p.str(); err != nil {
				return h, err
			}
			if h.kind, h.bigEndian, err = npyDescr(h.descr); err != nil {
				return h, err
			}
		case "fortran_order":
			if fortran, err = p.boolean(); err != nil {
				return h, err
			}
		case "shape":
			if h.shape, err = p.intTuple(); err != nil {
				return h, err
			}
		default:
			return h, fmt.Errorf("unexpected key %q", key)
		}
		switch p.peek() {
		case ',':
			p.pos++
		case '}':
		default:
			return h, fmt.Errorf("want ',' or '}' at offset %d", p.pos)
		}
	}
	if rest := strings.TrimSpace(s[p.pos:]); rest != "" {
		return h, fmt.Errorf("%q after the header dict", rest)
	}
	for _, k := range []string{"descr", "fortran_order", "shape"} {
		if !seen[k] {
			return h, fmt.Errorf("no %q", k)
		}
	}
	if fortran && len(h.shape) > 1 {
		return h, errors.New("Fortran-ordered arrays are not supported; save with numpy.ascontiguousarray")
	}
	return h, nil
}

// npyDescr maps a dtype string such as "<f4" or "|u1".
func npyDescr(d string) (elemKind, bool, error) {
	if len(d) < 2 {
		return 0, false, fmt.Errorf("dtype %q", d)
	}
	big := false
	switch d[0] {
	case '<', '|', '=':
		d = d[1:]
	case '>':
		big = true
		d = d[1:]
	}
	kinds := map[string]elemKind{
		"b1": kindBool, "u1": kindU8, "i1": kindI8,
		"i2": kindI16, "u2": kindU16, "f2": kindF16,
		"i4": kindI32, "u4": kindU32, "f4": kindF32,
		"i8": kindI64, "u8": kindU64, "f8": kindF64,
	}
	k, ok := kinds[d]
	if !ok {
		return 0, false, fmt.Errorf("dtype %q is not supported (bool, int8..int64, uint8..uint64, float16/32/64)", d)
	}
	return k, big, nil
}

// pyLexer reads the few Python literals a .npy header uses.
type pyLexer struct {
	s   string
	pos int
}

func (p *pyLexer) skip() {
	for p.pos < len(p.s) && strings.IndexByte(" \t\r\n", p.s[p.pos]) >= 0 {
		p.pos++
	}
}

func (p *pyLexer) peek() byte {
	p.skip()
	if p.pos >= len(p.s) {
		return 0
	}
	return p.s[p.pos]
}

func (p *pyLexer) expect(c byte) error {
	if p.peek() != c {
		return fmt.Errorf("want %q at offset %d", c, p.pos)
	}
	p.pos++
	return nil
}

func (p *pyLexer) str() (string, error) {
	q := p.peek()
	if q != '\'' && q != '"' {
		return "", fmt.Errorf("want a string at offset %d", p.pos)
	}
	end := strings.IndexByte(p.s[p.pos+1:], q)
	if end < 0 {
		return "", errors.New("unterminated string")
	}
	v := p.s[p.pos+1 : p.pos+1+end]
	if strings.IndexByte(v, '\\') >= 0 {
		return "", errors.New("escapes in strings are not supported")
	}
	p.pos += end + 2
	return v, nil
}

func (p *pyLexer) boolean() (bool, error) {
	p.skip()
	switch {
	case strings.HasPrefix(p.s[p.pos:], "True"):
		p.pos += 4
		return true, nil
	case strings.HasPrefix(p.s[p.pos:], "False"):
		p.pos += 5
		return false, nil
	}
	return false, fmt.Errorf("want True or False at offset %d", p.pos)
}

func (p *pyLexer) intTuple() ([]uint64, error) {
	if err := p.expect('('); err != nil {
		return nil, err
	}
	out := []uint64{}
	for {
		if p.peek() == ')' {
			p.pos++
			return out, nil
		}
		start := p.pos
		for p.pos < len(p.s) && p.s[p.pos] >= '0' && p.s[p.pos] <= '9' {
			p.pos++
		}
		v, err := strconv.ParseUint(p.s[start:p.pos], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("want a dimension at offset %d", start)
		}
		if p.pos < len(p.s) && p.s[p.pos] == 'L' { // Python 2's long suffix
			p.pos++
		}
		if len(out) == MaxDims {
			return nil, fmt.Errorf("more than %d dimensions", MaxDims)
		}
		out = append(out, v)
		switch p.peek() {
		case ',':
			p.pos++
		case ')':
		default:
			return nil, fmt.Errorf("want ',' or ')' at offset %d", p.pos)
		}
	}
}
