package pluginhost

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/cohortdl/cohort/shared/atomicfile"
)

// maxSumsSize bounds a SHA256SUMS file that AddSum rewrites.
const maxSumsSize = 1 << 20

// AddSum records sum for the file bin in dir's SHA256SUMS, in the format
// sha256sum writes ("<hex>  <file>"), replacing any line for bin and
// creating the file when there is none.
func AddSum(dir, bin string, sum []byte) error {
	if bin == "" || strings.ContainsAny(bin, "/\\\n") {
		return fmt.Errorf("add %q to %s: not a file name", bin, SumsFile)
	}
	path := filepath.Join(dir, SumsFile)
	var out bytes.Buffer
	f, err := os.Open(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return fmt.Errorf("add %s to %s: %w", bin, path, err)
	default:
		src, err := io.ReadAll(io.LimitReader(f, maxSumsSize+1))
		f.Close()
		if err != nil {
			return fmt.Errorf("add %s to %s: %w", bin, path, err)
		}
		if len(src) > maxSumsSize {
			return fmt.Errorf("add %s to %s: the file is over %d bytes", bin, path, maxSumsSize)
		}
		sc := bufio.NewScanner(bytes.NewReader(src))
		for sc.Scan() {
			line := sc.Text()
			if _, file, ok := strings.Cut(strings.TrimSpace(line), " "); ok &&
				filepath.Base(strings.TrimPrefix(strings.TrimSpace(file), "*")) == bin {
				continue
			}
			out.WriteString(line)
			out.WriteByte('\n')
		}
		if err := sc.Err(); err != nil {
			return fmt.Errorf("add %s to %s: %w", bin, path, err)
		}
	}
	fmt.Fprintf(&out, "%s  %s\n", hex.EncodeToString(sum), bin)
	return atomicfile.WriteBytes(path, out.Bytes(), atomicfile.Perm(0o644))
}
