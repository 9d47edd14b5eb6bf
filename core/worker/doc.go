// Package worker is the rank process: it hosts the rank's trainer and
// averaging plugins, bridges them to the coordinator over one control
// connection (core/worker/link), keeps the heartbeat, runs the watchdog
// that aborts a round when a peer dies, runs the epoch loop, and tears
// everything down in order.
//
// The conversation it holds is docs/protocol.md. Run is the whole life of a
// rank: connect, handshake, Admit, plugin setup, Ready, then commands until
// Shutdown (a clean exit, announced with Exiting) or an error (no Exiting,
// so the coordinator sees a death). A coordinator lost after Ready is
// given the liveness timeout to come back: the rank stops training, keeps
// its plugins, arena and model, redials, and on a comeback Admit sends
// Ready again with what its model holds (comeback.go).
//
// The pieces:
//
//   - worker.go: Run, the setup in the protocol's order, Ready, teardown.
//   - loop.go: the main loop, which handles commands in order and runs a
//     plan between them (runNextPlan).
//   - plans.go: the planQueue, the rank's work: plans to run, plans held
//     behind a round, each epoch's shape for ExtendPartition, the global
//     step the next plan passes, the Throttle.
//   - core/worker/supervisor: the Supervisor, which owns the two plugins
//     (handles, configuration, the arena they share, their checkpoints
//     and the restart budget); its Recover is the one place a lost plugin
//     is handled. plugins.go names its Plugins here for Run's users.
//   - round.go: an averaging round, Publish to SyncAck; overlap.go: one
//     running beside training.
//   - reports.go: a plan's batch reports, merged into Batch frames and
//     summed into its Metrics; scalars.go: the trainer's named figures.
//   - save.go: Checkpoint, ShutdownWithSave and Evaluate.
//   - core/worker/link: the control link itself (dial, handshake, Admit,
//     Send, the reading goroutine, heartbeat, the relay and meeting point).
//   - bridge.go: the inbound bridge (what the link reads, handed to the
//     rank) and the resource sampler; membership.go: the dead-rank ledger,
//     the session mailbox and the watchdog.
//   - comeback.go: a lost coordinator's comeback: what the rank keeps
//     (heldWork, what it trained since its last successful round), the
//     redial, and rejoining the coordinator that came back.
//   - queue.go (the command queue and owned goroutines), options.go,
//     prof.go.
//
// Life of a plan: mainLoop finds no command queued and the planQueue
// ready; runNextPlan takes the next plan, fires the epoch callback and
// calls the supervisor's trainer's Train; each batch report is summed and
// sent on (reports.go), and between batches a round beside training starts
// or finishes (overlap.go); Metrics close the plan. A trainer lost in Train
// goes to the supervisor's Recover, which replaces it and reports the plan
// lost.
//
// Life of a Sync: link.Read hands the frame to the bridge (bridge.go),
// which queues it; mainLoop pops it and handle (loop.go) calls round
// (round.go), which applies a pending session, has the supervisor's
// trainer Publish, the averager Average and the trainer Adopt, and sends
// the SyncAck through the link. A plugin lost on the way goes to the
// supervisor's Recover; a peer's death reaches the round through the
// watchdog (membership.go).
//
// Neighbours: core/worker/link (the control link) and core/wire/wirepb
// (its frames), core/worker/supervisor (the plugins), core/pluginhost
// (plugin processes), shared/plugin (the contracts the plugins serve),
// shared/arena (the parameters' shared memory). The other end of the link
// is core/coordinator; cmd/cohort runs Run as `cohort worker`.
//
// Goroutines, each owned by Run and joined before it returns:
//
//   - inbound bridge (link.Read, handing frames to bridge): receives every
//     frame; membership frames (DeclareDead, NewSession, RequestSessionId)
//     are handled there because the main loop may be blocked inside a
//     round; the rest queue for the main loop. A broken or silent link
//     poisons the dead-rank ledger and queues an error; after Ready it ends
//     only the link's context, and the main loop waits for a comeback.
//     Each new link gets a reader and heartbeat of its own; the old ones
//     are joined first.
//   - heartbeat (link.Heartbeat) and resource sampler: periodic frames from
//     their own goroutines, so a rank blocked in a round is not taken for
//     dead.
//   - watchdog: aborts the averaging round in flight when a peer dies.
//   - an overlapped round's averaging, owned by the main loop, which joins
//     it before anything else touches the averager.
//
// The core/wire Conn's own writer goroutine does every socket write.
package worker
