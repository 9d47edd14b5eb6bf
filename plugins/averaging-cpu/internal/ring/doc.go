// Package ring owns the bytes between host leaders: when a cohort spans
// hosts, each host's leader (this plugin's averager) sums its host's fold
// with the other leaders' by a ring all-reduce (reduce-scatter, then
// all-gather) over direct TCP links, so no link carries more than
// 2·(H−1)/H of a fold per round. The reduce server (core/reduceserver) only
// orchestrates: it tells each leader its peers' addresses and when its host
// folded, and fails the round everywhere when a leader aborts.
//
// A link is one TCP connection from a leader to its successor in the ring,
// opened by the first round of a topology that needs it and kept for the
// topology's later rounds until one fails (the averager drops a failed
// round's links on every leader). All integers are little-endian. The dialer opens
// with an 80-byte hello; the listener answers a hello whose tag verifies
// with a 32-byte ack:
//
//	hello  magic u32 | version u32 | from u32 | to u32 | hosts u32 | reserved u32 |
//	       topology u64 | round u64 | run [16] | nonce [16] | tag [8]
//	ack    magic u32 | reserved u32 | nonce [16] | tag [8]
//
// from and to are host indices (the topology's order), topology and round
// name the round that opened the link. The hello's tag is HMAC-SHA256 under the
// handshake key over its first 72 bytes; the ack's covers its first 24
// bytes followed by the whole hello. The link's key is
// HMAC-SHA256(forward key, hello | ack[0:24]), unique per link since both
// nonces are fresh.
//
// Then the dialer sends frames, the listener only reads:
//
//	frame  magic u32 | step u32 | length u64 | payload | tag [16]
//
// A step's shard of n bytes travels as frames of Chunk(n) bytes (the last
// may be shorter): about n/32, within [MinChunk, ChunkSize]. The tag is
// the frame's GMAC (shared/authframe): AES-GCM under the link key over an
// empty plaintext with the payload as additional data and the frame's
// sequence number as nonce, so a tampered, dropped, replayed or reordered
// frame fails; the sequence runs on across the link's rounds, so a frame
// never passes for another round's either. The reader knows every frame's
// step and length before it arrives and refuses any other header before
// reading the payload. The sender tags chunk i+1 while chunk i is on the
// wire, the receiver verifies and reduces chunk i while chunk i+1 arrives,
// and a step sends each chunk of the shard the previous step received as
// soon as that chunk is reduced: no step waits for the whole of the
// previous one. A leader may also build the first shard it sends chunk by
// chunk as the ring takes it (Job.Prepare) and use each chunk of the result
// as soon as it is final (Job.Final), so neither a pass before the first
// byte nor one after the last holds the ring up. Every read and write has a
// deadline.
//
// Where is: handshake.go the keys, hello, ack, Dial and Listener; link.go
// the frames and the pipelined Send and Receive; allreduce.go the ring
// schedule.
package ring

import (
	"encoding/binary"

	"github.com/cohortdl/cohort/shared/authframe"
)

// Protocol constants; the magics differ from the data channel's, so a
// leader dialling the reduce server's port fails at once.
const (
	Version    uint32 = 1
	HelloMagic uint32 = 0xC04ED101
	AckMagic   uint32 = 0xC04ED102
	FrameMagic uint32 = 0xC04ED103

	HelloSize  = 80
	AckSize    = 32
	HeaderSize = 16

	// ChunkSize and MinChunk bound a frame's payload (see Chunk), the unit
	// of the MAC and step pipeline. 256 KiB keeps a chunk in cache from its
	// read through its verify and reduce: loopback rings ran 1.6× faster
	// than at 1 MiB.
	ChunkSize = 1 << 18
	MinChunk  = 1 << 16

	tagSize  = authframe.TagSize
	gtagSize = authframe.GMACTagSize
)

var le = binary.LittleEndian
