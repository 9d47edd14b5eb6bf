// Package worker is the rank process: it hosts the rank's trainer and
// averaging plugins, bridges them to the coordinator over one control
// connection (core/wire), keeps the heartbeat, runs the watchdog that aborts
// a round when a peer dies, runs the epoch loop, and tears everything down
// in order.
//
// The conversation it holds is docs/protocol.md. Run is the whole life of a
// rank: connect, handshake, Admit, plugin setup, Ready, then commands until
// Shutdown (a clean exit, announced with Exiting) or an error (no Exiting,
// so the coordinator sees a death).
//
// Goroutines, each owned by Run and joined before it returns:
//
//   - inbound bridge: receives every frame; membership frames (DeclareDead,
//     NewSession, RequestSessionId) are handled there because the main loop
//     may be blocked inside a round; the rest queue for the main loop. A
//     broken or silent link poisons the dead-rank ledger and injects an
//     error stop.
//   - heartbeat and resource sampler: periodic frames from their own
//     goroutines, so a rank blocked in a round is not taken for dead.
//   - watchdog: aborts the averaging round in flight when a peer dies.
//
// The core/wire Conn's own writer goroutine does every socket write.
package worker
