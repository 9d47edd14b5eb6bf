package pluginhost

import (
	"bytes"
	"sync"
)

// stderrTailBytes is how much of a plugin's stderr a failed start quotes:
// enough for an error message or a panic's first lines.
const stderrTailBytes = 2048

// stderrTail keeps the last stderrTailBytes a plugin wrote to stderr, for
// the error of a plugin that never completed the handshake (go-plugin
// hands the raw stderr to it as well as to the logger).
type stderrTail struct {
	mu  sync.Mutex
	buf []byte
}

func (s *stderrTail) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf = append(s.buf, b...)
	if over := len(s.buf) - stderrTailBytes; over > 0 {
		s.buf = append(s.buf[:0], s.buf[over:]...)
	}
	return len(b), nil
}

func (s *stderrTail) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(bytes.TrimSpace(s.buf))
}
