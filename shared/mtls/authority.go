package mtls

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"time"
)

// Authority is a small certificate authority for a cluster's hosts: an
// ECDSA P-256 CA whose host certificates serve and authenticate as clients
// both, so any host may run the coordinator or a worker.
type Authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// CertPEM is the CA certificate, every side's Files.CA.
	CertPEM []byte
}

// DefaultValidity is how long `cohort tls init`'s certificates last.
const DefaultValidity = 365 * 24 * time.Hour

// NewAuthority makes a CA named name, valid from an hour ago (clocks
// disagree) for validFor.
func NewAuthority(name string, validFor time.Duration) (*Authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("tls: CA key: %w", err)
	}
	tmpl, err := template(name, validFor)
	if err != nil {
		return nil, err
	}
	tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.MaxPathLenZero = true, true, true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("tls: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("tls: CA certificate: %w", err)
	}
	return &Authority{cert: cert, key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

func template(name string, validFor time.Duration) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("tls: serial number: %w", err)
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{Organization: []string{"cohort"}, CommonName: name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(validFor),
	}, nil
}

// Issue makes a certificate and key for a host, PEM-encoded, valid for
// validFor and for every name in names: DNS names and IP addresses (its
// subject alternative names; the first is its common name too).
func (a *Authority) Issue(names []string, validFor time.Duration) (certPEM, keyPEM []byte, err error) {
	if len(names) == 0 {
		return nil, nil, errors.New("tls: a certificate needs at least one host name or address")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: key for %s: %w", names[0], err)
	}
	tmpl, err := template(names[0], validFor)
	if err != nil {
		return nil, nil, err
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	for _, n := range names {
		if err := checkHost(n); err != nil {
			return nil, nil, err
		}
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: certificate for %s: %w", names[0], err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: key for %s: %w", names[0], err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

var dnsName = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*$`)

// checkHost refuses what is neither an IP address nor a DNS name; a host's
// name also names its files.
func checkHost(h string) error {
	if net.ParseIP(h) != nil || (len(h) <= 253 && dnsName.MatchString(h)) {
		return nil
	}
	return fmt.Errorf("tls: %q is neither a host name nor an IP address", h)
}

// Loopback are the names `cohort tls init --localhost` adds to every host's
// certificate, for runs whose ranks dial the coordinator on loopback.
var Loopback = []string{"localhost", "127.0.0.1", "::1"}

// CAFile is the CA certificate's name in a directory WriteCluster made.
const CAFile = "ca.pem"

// HostFiles are the files WriteCluster writes for host in dir.
func HostFiles(dir, host string) Files {
	return Files{
		CA:   filepath.Join(dir, CAFile),
		Cert: filepath.Join(dir, host+".pem"),
		Key:  filepath.Join(dir, host+"-key.pem"),
	}
}

// WriteCluster makes a CA and a certificate for each host and writes them
// to dir (made if missing): ca.pem, and HOST.pem and HOST-key.pem (mode
// 0600) per host, each certificate valid for its host plus extra (say
// Loopback). The CA's key is not kept: adding a host means a new
// cluster's files. It refuses a dir that already holds a ca.pem, so a
// cluster's files are never replaced by accident.
func WriteCluster(dir string, hosts, extra []string, validFor time.Duration) error {
	if len(hosts) == 0 {
		return errors.New("tls: no hosts")
	}
	for i, h := range hosts {
		if err := checkHost(h); err != nil {
			return err
		}
		if slices.Contains(hosts[:i], h) {
			return fmt.Errorf("tls: host %q is named twice", h)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	ca, err := NewAuthority("cohort CA", validFor)
	if err != nil {
		return err
	}
	// O_EXCL: a second init into the same directory fails here, before
	// anything is written.
	if err := writeNew(filepath.Join(dir, CAFile), ca.CertPEM, 0o644); errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("tls: %s already holds a cluster's files (%s); they are never replaced: pick another directory: %w", dir, CAFile, err)
	} else if err != nil {
		return err
	}
	for _, h := range hosts {
		names := []string{h}
		for _, x := range extra {
			if !slices.Contains(names, x) {
				names = append(names, x)
			}
		}
		certPEM, keyPEM, err := ca.Issue(names, validFor)
		if err != nil {
			return err
		}
		f := HostFiles(dir, h)
		if err := writeNew(f.Key, keyPEM, 0o600); err != nil {
			return err
		}
		if err := writeNew(f.Cert, certPEM, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func writeNew(path string, b []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("tls: write %s: %w", path, err)
	}
	return nil
}
