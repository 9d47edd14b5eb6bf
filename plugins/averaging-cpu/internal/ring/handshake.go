package ring

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/cohortdl/cohort/shared/authframe"
	"github.com/cohortdl/cohort/shared/mtls"
)

var schedule = authframe.Schedule{
	Protocol:  "ring",
	Secret:    "data key",
	MinSecret: 16,
	Handshake: "cohort/ring/v1/handshake",
	Frames:    [2]string{"cohort/ring/v1/forward", "cohort/ring/v1/backward"},
}

// Keys are the ring's keys, derived from the averager's data key under
// labels of their own, so a ring key never serves the data channel; with
// WithTLS, the links they make run inside mutual TLS as well.
type Keys struct {
	k   authframe.Keys
	tls *mtls.Files
}

// WithTLS makes the links of these keys run inside mutual TLS with the
// rank's files (the run's TLS), under the authenticated framing: a
// leader's certificate must chain to the CA and name the address its
// predecessor dials. nil keeps plain TCP.
func (k Keys) WithTLS(f *mtls.Files) Keys {
	k.tls = f
	return k
}

// DeriveKeys derives the ring's keys from the data key.
func DeriveKeys(dataKey []byte) (Keys, error) {
	k, err := authframe.DeriveKeys(schedule, dataKey)
	return Keys{k: k}, err
}

// Format keeps key material out of logs.
func (k Keys) Format(f fmt.State, verb rune) { k.k.Format(f, verb) }

// Hello names a link's ends and the round that opened it.
type Hello struct {
	From, To, Hosts uint32
	Topology, Round uint64
	Run             [16]byte
}

func (h Hello) encode(k Keys, nonce [16]byte) []byte {
	b := make([]byte, 0, HelloSize)
	b = le.AppendUint32(b, HelloMagic)
	b = le.AppendUint32(b, Version)
	b = le.AppendUint32(b, h.From)
	b = le.AppendUint32(b, h.To)
	b = le.AppendUint32(b, h.Hosts)
	b = le.AppendUint32(b, 0)
	b = le.AppendUint64(b, h.Topology)
	b = le.AppendUint64(b, h.Round)
	b = append(b, h.Run[:]...)
	b = append(b, nonce[:]...)
	return append(b, authframe.Tag(k.k.Handshake(), b)...)
}

// DecodeHello checks a hello's tag and fields and returns it.
func DecodeHello(k Keys, b []byte) (Hello, error) {
	if len(b) != HelloSize {
		return Hello{}, fmt.Errorf("ring: %w: hello of %d bytes, want %d", authframe.ErrTruncated, len(b), HelloSize)
	}
	if !authframe.TagOK(k.k.Handshake(), b[HelloSize-tagSize:], b[:HelloSize-tagSize]) {
		return Hello{}, fmt.Errorf("ring: %w: hello (another run's key, or tampered)", authframe.ErrBadTag)
	}
	h := Hello{From: le.Uint32(b[8:]), To: le.Uint32(b[12:]), Hosts: le.Uint32(b[16:]),
		Topology: le.Uint64(b[24:]), Round: le.Uint64(b[32:])}
	copy(h.Run[:], b[40:56])
	switch {
	case le.Uint32(b) != HelloMagic:
		return Hello{}, fmt.Errorf("ring: %w: hello magic 0x%08x", authframe.ErrBadMagic, le.Uint32(b))
	case le.Uint32(b[4:]) != Version:
		return Hello{}, fmt.Errorf("ring: %w: hello of version %d, want %d", authframe.ErrMalformed, le.Uint32(b[4:]), Version)
	case le.Uint32(b[20:]) != 0:
		return Hello{}, fmt.Errorf("ring: %w: hello's reserved field set", authframe.ErrMalformed)
	case h.Hosts < 2 || h.From >= h.Hosts || h.To >= h.Hosts || h.To != (h.From+1)%h.Hosts:
		return Hello{}, fmt.Errorf("ring: %w: link from host %d to %d of %d is no ring edge", authframe.ErrMalformed, h.From, h.To, h.Hosts)
	}
	return h, nil
}

func ack(k Keys, hello []byte, nonce [16]byte) []byte {
	b := make([]byte, 0, AckSize)
	b = le.AppendUint32(b, AckMagic)
	b = le.AppendUint32(b, 0)
	b = append(b, nonce[:]...)
	return append(b, authframe.Tag(k.k.Handshake(), b, hello)...)
}

func checkAck(k Keys, a, hello []byte) error {
	if !authframe.TagOK(k.k.Handshake(), a[AckSize-tagSize:], a[:AckSize-tagSize], hello) {
		return fmt.Errorf("%w: ack", authframe.ErrBadTag)
	}
	if le.Uint32(a) != AckMagic || le.Uint32(a[4:]) != 0 {
		return fmt.Errorf("%w: ack header %x", authframe.ErrMalformed, a[:8])
	}
	return nil
}

func (k Keys) link(nc net.Conn, hello, ackb []byte, h Hello, other uint32, timeout time.Duration) (*Link, error) {
	g, err := authframe.NewGMAC(k.k.ConnKey(0, hello, ackb[:AckSize-tagSize]))
	if err != nil {
		return nil, err
	}
	return &Link{nc: nc, mac: g, hello: h, other: other, timeout: timeout}, nil
}

// Dial opens the link from host h.From to its successor at addr, for
// round h.Round and the later rounds it serves, within timeout.
func Dial(ctx context.Context, addr string, k Keys, h Hello, timeout time.Duration) (*Link, error) {
	if !k.k.Valid() {
		return nil, errors.New("ring: keys not derived")
	}
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(dctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("ring: dial host %d's leader at %s: %w", h.To, addr, err)
	}
	noDelay(nc)
	if k.tls != nil {
		cfg, err := k.tls.ClientConfigFor(addr)
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("ring: %w", err)
		}
		if nc, err = mtls.Client(dctx, nc, cfg, timeout, fmt.Sprintf("host %d's leader at %s", h.To, addr)); err != nil {
			return nil, fmt.Errorf("ring: %w", err)
		}
	}
	var nonce [16]byte
	rand.Read(nonce[:])
	hello := h.encode(k, nonce)
	a := make([]byte, AckSize)
	err = authframe.SendHello(ctx, nc, timeout, hello, a, "ring", "the leader refused the link (another run, or not listening for this round)",
		func() error { return checkAck(k, a, hello) })
	if err != nil {
		nc.Close()
		return nil, err
	}
	l, err := k.link(nc, hello, a, h, h.To, timeout)
	if err != nil {
		nc.Close()
	}
	return l, err
}

// A Listener accepts the links of this leader's predecessor. Its goroutine
// answers every hello whose tag verifies and keeps the link until a round
// takes it; Close stops it and closes what no round took.
type Listener struct {
	ln      net.Listener
	keys    Keys
	run     [16]byte
	timeout time.Duration
	tls     *tls.Config // nil: plain TCP

	mu      sync.Mutex
	pending []*Link
	arrived chan struct{} // closed and replaced whenever pending grows
	wg      sync.WaitGroup
	quit    chan struct{}
	ctx     context.Context // ends on Close, interrupting handshakes
	stop    context.CancelFunc
}

// Listen listens on addr (host:port; port 0 picks one) for links of run.
func Listen(addr string, k Keys, run [16]byte, timeout time.Duration) (*Listener, error) {
	if !k.k.Valid() {
		return nil, errors.New("ring: keys not derived")
	}
	var tlsCfg *tls.Config
	if k.tls != nil {
		var err error
		if tlsCfg, err = k.tls.ServerConfig(); err != nil {
			return nil, fmt.Errorf("ring: %w", err)
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("ring: listen on %s: %w", addr, err)
	}
	l := &Listener{ln: ln, keys: k, run: run, timeout: timeout, tls: tlsCfg, arrived: make(chan struct{}), quit: make(chan struct{})}
	l.ctx, l.stop = context.WithCancel(context.Background())
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

// Port is the port the listener took.
func (l *Listener) Port() uint16 { return uint16(l.ln.Addr().(*net.TCPAddr).Port) }

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	for {
		nc, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			lk, err := l.handshake(nc)
			if err != nil {
				nc.Close()
				return
			}
			l.mu.Lock()
			select {
			case <-l.quit:
				lk.Close()
			default:
				l.pending = append(l.pending, lk)
				close(l.arrived)
				l.arrived = make(chan struct{})
			}
			l.mu.Unlock()
		}()
	}
}

func (l *Listener) handshake(nc net.Conn) (*Link, error) {
	noDelay(nc)
	if l.tls != nil {
		tc, err := mtls.Server(l.ctx, nc, l.tls, l.timeout, "a ring peer at "+nc.RemoteAddr().String())
		if err != nil {
			return nil, fmt.Errorf("ring: %w", err)
		}
		nc = tc
	}
	hello := make([]byte, HelloSize)
	var h Hello
	err := authframe.WithDeadline(l.ctx, nc, l.timeout, func() error {
		if err := authframe.ReadHello(l.ctx, nc, hello, "ring"); err != nil {
			return err
		}
		var err error
		if h, err = DecodeHello(l.keys, hello); err != nil {
			return err
		}
		if h.Run != l.run {
			return fmt.Errorf("ring: %w: hello of another run", authframe.ErrMalformed)
		}
		var nonce [16]byte
		rand.Read(nonce[:])
		_, err = nc.Write(ack(l.keys, hello, nonce))
		hello = append(hello, ack(l.keys, hello, nonce)...) // hello | ack, for the key
		return err
	})
	if err != nil {
		return nil, err
	}
	return l.keys.link(nc, hello[:HelloSize], hello[HelloSize:], h, h.From, l.timeout)
}

// Accept returns the link that host from opened for round of topology,
// waiting until ctx ends. Links of earlier rounds are closed.
func (l *Listener) Accept(ctx context.Context, from uint32, topology, round uint64) (*Link, error) {
	for {
		l.mu.Lock()
		var got *Link
		keep := l.pending[:0]
		for _, lk := range l.pending {
			h := lk.hello
			switch {
			case got == nil && h.From == from && h.Topology == topology && h.Round == round:
				got = lk
			case h.Round < round || (h.Round == round && h.Topology != topology):
				lk.Close()
			default:
				keep = append(keep, lk)
			}
		}
		clear(l.pending[len(keep):])
		l.pending = keep
		arrived := l.arrived
		l.mu.Unlock()
		if got != nil {
			return got, nil
		}
		select {
		case <-arrived:
		case <-ctx.Done():
			return nil, fmt.Errorf("ring: wait for host %d's link for round %d: %w", from, round, ctx.Err())
		case <-l.quit:
			return nil, fmt.Errorf("ring: listener closed: %w", net.ErrClosed)
		}
	}
}

// Close stops accepting, closes the links no round took and joins the
// listener's goroutines.
func (l *Listener) Close() error {
	l.mu.Lock()
	select {
	case <-l.quit:
		l.mu.Unlock()
		return nil
	default:
	}
	close(l.quit)
	l.mu.Unlock()
	l.stop()
	err := l.ln.Close()
	l.wg.Wait()
	for _, lk := range l.pending {
		lk.Close()
	}
	l.pending = nil
	return err
}

// noDelay sends each frame at once: the ring's steps wait on each other.
func noDelay(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
}
