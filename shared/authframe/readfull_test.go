package authframe

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// ReadFullWithin reads exactly what was asked, counts it, calls a stream
// that ends early unexpected, and gives up on a peer silent for the
// timeout.
func TestReadFullWithin(t *testing.T) {
	cases := []struct {
		name    string
		send    []byte
		close   bool
		want    int
		wantErr error
	}{
		{name: "whole", send: []byte("0123456789"), want: 10},
		{name: "ends early", send: []byte("0123"), close: true, want: 10, wantErr: io.ErrUnexpectedEOF},
		{name: "silent peer", send: []byte("01"), want: 10, wantErr: os.ErrDeadlineExceeded},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, b := tcpPair(t)
			defer a.Close()
			go func() {
				b.Write(c.send)
				if c.close {
					b.Close()
				}
			}()
			defer b.Close()
			buf := make([]byte, c.want)
			var n uint64
			err := ReadFullWithin(a, buf, 100*time.Millisecond, &n)
			if !errors.Is(err, c.wantErr) || (c.wantErr == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, c.wantErr)
			}
			if n != uint64(len(c.send)) || string(buf[:n]) != string(c.send) {
				t.Errorf("read %d bytes %q, want %q", n, buf[:n], c.send)
			}
		})
	}
}

// tcpPair is both ends of a loopback TCP connection. (net.Pipe will not
// do: its SetReadDeadline fails once the other end closed, where a
// socket's reads go on to the end of what was sent.)
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	b, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a, err := ln.Accept()
	if err != nil {
		b.Close()
		t.Fatal(err)
	}
	return a, b
}
