// Package hostshare gives the processes of one user on one host one
// read-only copy of a block of memory they would otherwise each build: the
// libtorch trainer's data image (../dataset's image.go), built by the first
// rank of a host to ask and mapped by the others.
//
// The block is a sealed memfd: nothing on a file system names it, so
// nothing of it outlives the last process that maps it, however they all
// die. Whoever builds it serves its descriptor on an abstract Unix socket
// named after the block's key and the user, for as long as it holds the
// Image; the socket, too, goes with its process. A rank that finds the name
// taken connects, checks that the server runs as the same user, receives
// the descriptor and maps it read-only after checking its seals, so no one
// can change or shrink it under its readers. It keeps the connection open:
// when the server goes (closed, or killed), the processes it served see
// the connection end and one of them serves the block from then on, so a
// rank that starts later (a replaced trainer) still finds the one copy. Abstract sockets belong to a
// network namespace: ranks in separate namespaces (hosts simulated on one
// machine) each build their own, as separate hosts do.
//
// The trainer that uses it is ../trainer.
package hostshare

// MaxSize bounds a block a process maps from another.
const MaxSize = 1 << 40

// Builder makes the block when this process is the first to ask: it
// returns the block's size and a fill that writes it into dst (size bytes,
// page-aligned and zeroed).
type Builder func() (size int, fill func(dst []byte), err error)

// BuildError is the Builder's own error, returned as is (wrapped in this):
// the data was bad, not the sharing.
type BuildError struct{ Err error }

func (e *BuildError) Error() string { return e.Err.Error() }
func (e *BuildError) Unwrap() error { return e.Err }

// Mapping is a read-only mapping of a block. It is unmapped once nothing
// refers to it any more (a cleanup on the Mapping), so whatever reads
// Bytes must keep the Mapping reachable while it does.
type Mapping struct {
	b []byte
}

// Bytes is the block.
func (m *Mapping) Bytes() []byte { return m.b }
