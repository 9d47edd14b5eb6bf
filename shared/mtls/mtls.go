// Package mtls is mutual TLS for cohort's channels: the CA, certificate and
// key files a side is configured with, the TLS 1.3 configurations both ends
// of a channel use (each side verifies the other against the CA; a client
// also checks the server's name), the handshake, with errors that say which
// side refused which certificate, and a small certificate authority that
// makes the files (`cohort tls init`, and tests). The control channel, the
// reduce server's data channel and any vendor's own channel share it.
package mtls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"
)

// Files names a side's PEM files. The zero Files means no TLS.
type Files struct {
	// CA holds the certificate(s) of the authority both sides' certificates
	// must chain to.
	CA string
	// Cert is this side's certificate chain, Key its private key.
	Cert, Key string
}

// Enabled reports whether any file is named: TLS is on.
func (f Files) Enabled() bool { return f != Files{} }

// FileError is a problem with one of the files: Field is "ca", "cert" or
// "key", so a config can point at the key that named it.
type FileError struct {
	Field, Path string
	Err         error
}

func (e *FileError) Error() string {
	if e.Path == "" || strings.Contains(e.Err.Error(), e.Path) { // an *fs.PathError names it already
		return e.Err.Error()
	}
	return fmt.Sprintf("%s: %v", e.Path, e.Err)
}

func (e *FileError) Unwrap() error { return e.Err }

// Check loads the files as a handshake would and says what is wrong: a
// missing file, one that does not parse, a certificate that does not match
// its key or does not chain to the CA. The error is a *FileError.
func (f Files) Check() error {
	_, _, err := f.load()
	return err
}

// maxFile bounds a PEM file: a CA bundle is kilobytes.
const maxFile = 1 << 20

func readPEM(field, path string) ([]byte, error) {
	if path == "" {
		return nil, &FileError{Field: field, Err: fmt.Errorf("no %s file named: a TLS side needs ca, cert and key", field)}
	}
	fh, err := os.Open(path)
	if err != nil {
		return nil, &FileError{Field: field, Path: path, Err: err}
	}
	defer fh.Close()
	// A FIFO or device would block or never end: only plain files.
	if st, err := fh.Stat(); err != nil || !st.Mode().IsRegular() {
		if err == nil {
			err = fmt.Errorf("is a %v, not a plain file", st.Mode().Type())
		}
		return nil, &FileError{Field: field, Path: path, Err: err}
	}
	b, err := io.ReadAll(io.LimitReader(fh, maxFile+1))
	if err == nil && len(b) > maxFile {
		err = fmt.Errorf("more than %d bytes: not a PEM file", maxFile)
	}
	if err != nil {
		return nil, &FileError{Field: field, Path: path, Err: err}
	}
	return b, nil
}

// load reads the CA pool and this side's key pair, and checks that the
// certificate chains to the CA.
func (f Files) load() (*x509.CertPool, tls.Certificate, error) {
	caPEM, err := readPEM("ca", f.CA)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	pool, n := x509.NewCertPool(), 0
	for rest := caPEM; ; {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, tls.Certificate{}, &FileError{Field: "ca", Path: f.CA, Err: err}
		}
		pool.AddCert(c)
		n++
	}
	if n == 0 {
		return nil, tls.Certificate{}, &FileError{Field: "ca", Path: f.CA, Err: errors.New("holds no PEM CERTIFICATE block")}
	}
	certPEM, err := readPEM("cert", f.Cert)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	keyPEM, err := readPEM("key", f.Key)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, tls.Certificate{}, &FileError{Field: "cert", Path: f.Cert, Err: fmt.Errorf("with key %s: %w", f.Key, err)}
	}
	inter := x509.NewCertPool()
	for _, der := range pair.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	_, err = pair.Leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	if err != nil {
		return nil, tls.Certificate{}, &FileError{Field: "cert", Path: f.Cert, Err: fmt.Errorf("does not chain to the CA in %s: %w", f.CA, err)}
	}
	return pool, pair, nil
}

// ServerConfig is the TLS configuration of a channel's accepting end: TLS
// 1.3, this side's certificate, and every client must present a
// certificate that chains to the CA.
func (f Files) ServerConfig() (*tls.Config, error) {
	pool, pair, err := f.load()
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{pair},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
	}, nil
}

// ClientConfig is the TLS configuration of a channel's dialling end: TLS
// 1.3, this side's certificate, and the server's certificate must chain to
// the CA and name serverName (a host name or an IP address: the host part
// of the address dialled).
func (f Files) ClientConfig(serverName string) (*tls.Config, error) {
	pool, pair, err := f.load()
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{pair},
		RootCAs:      pool,
		ServerName:   serverName,
	}, nil
}

// ClientConfigFor is ClientConfig for the server at addr, host:port.
func (f Files) ClientConfigFor(addr string) (*tls.Config, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("tls: server address %q: %w", addr, err)
	}
	return f.ClientConfig(host)
}

// The refusals a handshake's error wraps, for errors.Is.
var (
	// ErrPeerCertificate: the peer's certificate did not verify here (no
	// certificate, another CA, or, from a server, not the name dialled).
	ErrPeerCertificate = errors.New("the peer's certificate did not verify")
	// ErrRefusedByPeer: the peer refused this side's certificate, or this
	// side's TLS, with an alert.
	ErrRefusedByPeer = errors.New("the peer refused this side's certificate")
)

// Server runs the accepting end's TLS handshake on nc within timeout (or
// ctx's deadline, if sooner). On failure nc is closed, after the client
// has had a moment to read the alert that says why. peer names the other
// side in errors ("the rank").
func Server(ctx context.Context, nc net.Conn, cfg *tls.Config, timeout time.Duration, peer string) (*tls.Conn, error) {
	tc := tls.Server(nc, cfg)
	if err := handshake(ctx, tc, timeout); err != nil {
		lingerClose(nc)
		return nil, explain(err, peer)
	}
	return tc, nil
}

// Client runs the dialling end's TLS handshake on nc; see Server. Under TLS
// 1.3 the server judges the client's certificate after the client's
// handshake is done: a refusal arrives as an alert on the first read, which
// Explain makes legible.
func Client(ctx context.Context, nc net.Conn, cfg *tls.Config, timeout time.Duration, peer string) (*tls.Conn, error) {
	tc := tls.Client(nc, cfg)
	if err := handshake(ctx, tc, timeout); err != nil {
		nc.Close()
		return nil, explain(err, peer)
	}
	return tc, nil
}

func handshake(ctx context.Context, tc *tls.Conn, timeout time.Duration) error {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	return tc.HandshakeContext(ctx)
}

// Explain turns an error from a TLS connection's read or write that
// carries the peer's alert into one that says the peer refused this side
// (wrapping ErrRefusedByPeer); any other error is returned as it is. peer
// names the other side ("the coordinator").
func Explain(err error, peer string) error {
	if isRemoteAlert(err) {
		return &refusal{ErrRefusedByPeer, peer + " refused this side's TLS certificate (not signed by its CA, or none)", err}
	}
	return err
}

// refusal is a handshake error that errors.Is matches to its kind.
type refusal struct {
	kind error
	msg  string
	err  error
}

func (r *refusal) Error() string        { return r.msg + ": " + r.err.Error() }
func (r *refusal) Unwrap() error        { return r.err }
func (r *refusal) Is(target error) bool { return target == r.kind }

func isRemoteAlert(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "remote error"
}

// explain says what a failed handshake means. A client without a
// certificate reads, on the server, as crypto/tls's own "client didn't
// provide a certificate".
func explain(err error, peer string) error {
	var verr *tls.CertificateVerificationError
	switch {
	case isRemoteAlert(err):
		return Explain(err, peer)
	case errors.As(err, &verr):
		return &refusal{ErrPeerCertificate, peer + "'s TLS certificate did not verify (signed by another CA, or not for the name dialled)", err}
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("tls: %s closed the connection during the TLS handshake (does it run TLS?): %w", peer, err)
	}
	var rh tls.RecordHeaderError
	if errors.As(err, &rh) {
		return fmt.Errorf("tls: %s does not speak TLS: %w", peer, err)
	}
	return fmt.Errorf("tls: handshake with %s: %w", peer, err)
}

// lingerClose closes nc so that the alert already written reaches the peer:
// a close with the peer's bytes unread would reset the connection, and the
// reset can overtake the alert. It stops writing, drains briefly, closes.
func lingerClose(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
		_ = tc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		_, _ = io.Copy(io.Discard, io.LimitReader(tc, 64<<10))
	}
	nc.Close()
}
