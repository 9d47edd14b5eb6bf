package wire

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/cohortdl/cohort/core/wire/wirepb"
	"github.com/cohortdl/cohort/shared/authframe"
	"google.golang.org/protobuf/proto"
)

var (
	testSecret  = []byte("cohort-test-secret-0123456789")
	otherSecret = []byte("cohort-other-secret-987654321")
)

func mustKeys(t testing.TB, secret []byte) Keys {
	t.Helper()
	k, err := DeriveKeys(secret)
	if err != nil {
		t.Fatalf("DeriveKeys: %v", err)
	}
	return k
}

// testNonce is a fixed nonce for hand-made hellos and acks.
func testNonce(b byte) (n nonce) {
	for i := range n {
		n[i] = b
	}
	return n
}

// rawPair returns the two ends of a connection: an in-memory pipe, or
// loopback TCP.
func rawPair(t testing.TB, network string) (client, server net.Conn) {
	t.Helper()
	if network == "pipe" {
		client, server = net.Pipe()
	} else {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("listen: %v", err)
		}
		defer ln.Close()
		type res struct {
			c   net.Conn
			err error
		}
		ch := make(chan res, 1)
		go func() {
			c, err := ln.Accept()
			ch <- res{c, err}
		}()
		client, err = net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		r := <-ch
		if r.err != nil {
			t.Fatalf("accept: %v", r.err)
		}
		server = r.c
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// connPair runs a real handshake and returns the rank's and the
// coordinator's Conn.
func connPair(t testing.TB, network string, hello Hello, opts ...Option) (rank, coord *Conn) {
	t.Helper()
	keys := mustKeys(t, testSecret)
	cn, sn := rawPair(t, network)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	type res struct {
		c   *Conn
		h   Hello
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, h, err := ServerHandshake(ctx, sn, keys, nil, opts...)
		ch <- res{c, h, err}
	}()
	rank, err := ClientHandshake(ctx, cn, keys, hello, opts...)
	if err != nil {
		t.Fatalf("ClientHandshake: %v", err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatalf("ServerHandshake: %v", r.err)
	}
	if r.h != hello || r.c.Hello() != hello || rank.Hello() != hello {
		t.Fatalf("hello: server saw %+v (conn %+v), client %+v, sent %+v", r.h, r.c.Hello(), rank.Hello(), hello)
	}
	t.Cleanup(func() { rank.Close(); r.c.Close() })
	return rank, r.c
}

// fakeRank completes a handshake by hand on the client end of a pipe to a
// real coordinator, and returns the frame writer a rank would use, so tests
// can put arbitrary bytes on the wire.
func fakeRank(t testing.TB, hello Hello, opts ...Option) (raw net.Conn, w *frameWriter, coord *Conn) {
	t.Helper()
	keys := mustKeys(t, testSecret)
	cn, sn := rawPair(t, "pipe")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	type res struct {
		c   *Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, _, err := ServerHandshake(ctx, sn, keys, nil, opts...)
		ch <- res{c, err}
	}()
	hb := encodeHello(hello, testNonce(1), keys.k.Handshake())
	if _, err := cn.Write(hb[:]); err != nil {
		t.Fatalf("write hello: %v", err)
	}
	var cb [challengeSize]byte
	if _, err := readFullTimeout(cn, cb[:]); err != nil {
		t.Fatalf("read challenge: %v", err)
	}
	proof := encodeSeal(ProofMagic, keys.k.Handshake(), hb[:], cb[:])
	if _, err := cn.Write(proof[:]); err != nil {
		t.Fatalf("write proof: %v", err)
	}
	var ab [sealSize]byte
	if _, err := readFullTimeout(cn, ab[:]); err != nil {
		t.Fatalf("read ack: %v", err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatalf("ServerHandshake: %v", r.err)
	}
	t.Cleanup(func() { r.c.Close() })
	return cn, &frameWriter{mac: authframe.NewMAC(connKey(keys, dirToCoord, hb[:], cb[:challengeCore]))}, r.c
}

// writerAt returns a frame writer under key whose next frame has sequence
// number seq, as the writer of a connection that has sent seq frames.
func writerAt(key []byte, seq uint64) *frameWriter {
	w := &frameWriter{mac: authframe.NewMAC(key)}
	for range seq {
		w.appendFrame(nil, wirepb.FrameKind_FRAME_KIND_HEARTBEAT, nil)
	}
	return w
}

func readFullTimeout(c net.Conn, b []byte) (int, error) {
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	n := 0
	for n < len(b) {
		m, err := c.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// frameBytes encodes msgs as consecutive frames (sequence 0, 1, ...) under key.
func frameBytes(t testing.TB, key []byte, msgs ...proto.Message) [][]byte {
	t.Helper()
	w := &frameWriter{mac: authframe.NewMAC(key)}
	out := make([][]byte, len(msgs))
	for i, m := range msgs {
		kind, payload, err := Encode(m)
		if err != nil {
			t.Fatalf("Encode: %v", err)
		}
		out[i] = w.appendFrame(nil, kind, payload)
	}
	return out
}

func isAny(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

func f64(v float64) *float64 { return &v }
func f32(v float32) *float32 { return &v }
func u64(v uint64) *uint64   { return &v }

// sampleMessages returns one populated message of every kind, so a field
// lost anywhere on the way shows up in proto.Equal.
func sampleMessages() []proto.Message {
	plan := &wirepb.EpochPlan{Epoch: 3, PartitionOffset: 1000, PartitionSize: 250, Seed: 0xDEADBEEF, PickSpace: 60000}
	res := &wirepb.ResourceSample{
		Rank: 2, CpuPercent: f32(37.5), RamUsedBytes: u64(1 << 33), RamTotalBytes: u64(1 << 36), RssBytes: u64(1 << 30),
		Gpus: []*wirepb.GpuSample{
			{Index: 0, Name: "H200", UtilPercent: f32(99), MemoryUsedBytes: u64(7 << 30), MemoryTotalBytes: u64(141 << 30)},
			{Index: 1, Name: "H200"},
		},
		UnixNanos: -5,
	}
	return []proto.Message{
		// coordinator -> rank
		&wirepb.StartEpoch{Plan: plan},
		&wirepb.Sync{Round: 9, Mode: wirepb.SyncMode_SYNC_MODE_BROADCAST, Root: 1},
		&wirepb.Update{Version: 42, NextPlan: plan},
		&wirepb.Throttle{},
		&wirepb.SetGlobalStep{GlobalStep: 1 << 40},
		&wirepb.Checkpoint{Version: ^uint64(0), TargetRank: 7, Dir: "/tmp/ckpt/ü"},
		&wirepb.Evaluate{ScheduleId: 10, Epoch: 5, TargetRank: 3},
		&wirepb.ExtendPartition{Epoch: 2, PartitionOffset: 12, PartitionSize: 34},
		&wirepb.DeclareDead{Rank: 3, Reason: "heartbeat timeout"},
		&wirepb.RequestSessionId{Generation: 4},
		&wirepb.NewSession{Generation: 4, SessionId: []byte{0, 1, 2, 0xff}, NewRank: 1, NewWorldSize: 3, Members: []uint32{0, 2, 5}},
		&wirepb.SetEpochCallbackRole{Rank: 2},
		&wirepb.Shutdown{},
		&wirepb.ShutdownWithSave{Reason: wirepb.ShutdownReason_SHUTDOWN_REASON_SINGLE_SURVIVOR, Dir: "/ckpt", Version: 8},
		&wirepb.CoordinatorHeartbeat{Sequence: 77},
		&wirepb.Admit{RunId: "run-7", Seed: 1, ResumeDir: "/ckpt/run-7", Epochs: 3},
		&wirepb.Meeting{Kind: "reduce-server", Endpoint: ":9000"},
		&wirepb.RelayResult{Key: "nccl/0", Blobs: []*wirepb.RelayBlob{{Rank: 0, Blob: []byte{1, 2, 3}}, {Rank: 1}}},
		&wirepb.EpochEnd{Epoch: 4, TargetRank: 2},
		// rank -> coordinator
		&wirepb.Ready{Rank: 1, Samples: 60000, EvalSamples: 10000, ParameterCount: 1 << 20, ParameterBytes: 4 << 20,
			LayoutDigest: make([]byte, 32), Trainer: "libtorch", Averager: "fabric", BatchSize: 64},
		&wirepb.Batch{Rank: 1, Epoch: 2, BatchMs: 12.5, DataMs: 0.25, StepCount: 42, ParamNorm: f64(3.5), BatchLoss: 0.1, Samples: 64},
		&wirepb.SyncAck{Rank: 2, Round: 100, StepCount: 5, Divergence: f64(0.01), PostNorm: f64(5), PreNorm: f64(5.01),
			Weight: 3, TotalWeight: 4, BytesMoved: 1 << 22, RoundMs: 8.5},
		&wirepb.Heartbeat{Rank: 3, Counter: 1000},
		&wirepb.SnapshotReady{Rank: 1, Round: 6},
		&wirepb.EvalResult{Rank: 0, ScheduleId: 10, Epoch: 5, Loss: 0.3, Accuracy: f64(0.91), Samples: 10000, ElapsedMs: 900, Error: ""},
		&wirepb.CheckpointResult{Rank: 2, Version: 8, ElapsedMs: 5, Error: "disk full", Files: []string{"a.pt", "b.pt"}},
		&wirepb.SessionIdGenerated{Rank: 0, Generation: 4, SessionId: []byte("nccl-unique-id")},
		&wirepb.EpochFnElapsed{Rank: 0, Epoch: 1, ElapsedMs: 3.25},
		res,
		&wirepb.Exiting{Rank: 3},
		&wirepb.Metrics{Rank: 1, Epoch: 3, AvgLoss: 0.42, Batches: 50, Samples: 6400, EpochMs: 1234.5, ComputeMs: 1100, DataMs: 90,
			Scalars:   map[string]*wirepb.ScalarSum{"loss": {Sum: 21, Count: 50}, "acc": {Sum: 45.5, Count: 50}},
			Resources: res, PartitionOffset: 100, PartitionSize: 6400},
		&wirepb.MeetRequest{Kind: "relay", Averager: "mock"},
		&wirepb.RelayPost{Key: "nccl/0", Blob: []byte("unique-id")},
		&wirepb.PluginRestarted{Rank: 2, Kind: "trainer", Reason: "plugin process exited", Restarts: 1,
			PlanLost: true, Epoch: 1, PartitionOffset: 640, PartitionSize: 320},
	}
}
