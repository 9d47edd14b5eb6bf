package wire

import (
	"errors"
	"fmt"

	cohortv1 "github.com/cohortdl/cohort/shared/proto/cohort/v1"
	"google.golang.org/protobuf/proto"
)

// Encode returns the frame kind of msg and its protobuf encoding (with
// deterministic map order). msg must be one of the message types that
// wire.proto's FrameKind names.
func Encode(msg proto.Message) (cohortv1.FrameKind, []byte, error) {
	kind := kindOf(msg)
	if kind == cohortv1.FrameKind_FRAME_KIND_UNSPECIFIED {
		if msg == nil || !msg.ProtoReflect().IsValid() {
			return 0, nil, errors.New("wire: cannot encode a nil message")
		}
		return 0, nil, fmt.Errorf("wire: %s is not a control message", msg.ProtoReflect().Descriptor().FullName())
	}
	if !msg.ProtoReflect().IsValid() {
		return 0, nil, fmt.Errorf("wire: cannot encode a nil %s", kind)
	}
	payload, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return 0, nil, fmt.Errorf("wire: encode %s: %w", kind, err)
	}
	return kind, payload, nil
}

// Decode parses payload as the message type that kind names. An unknown kind
// wraps ErrUnknownKind; a payload that does not parse is an error naming the
// kind.
func Decode(kind cohortv1.FrameKind, payload []byte) (proto.Message, error) {
	msg := newMessage(kind)
	if msg == nil {
		return nil, fmt.Errorf("%w: %d", ErrUnknownKind, uint32(kind))
	}
	if err := proto.Unmarshal(payload, msg); err != nil {
		return nil, fmt.Errorf("wire: decode %s payload (%d bytes): %w", kind, len(payload), err)
	}
	return msg, nil
}

// newMessage returns an empty message of the type kind names, or nil for a
// kind wire.proto does not list. It is the one place that lists the kinds: a
// frame reader accepts exactly the kinds it knows.
func newMessage(kind cohortv1.FrameKind) proto.Message {
	switch kind {
	case cohortv1.FrameKind_FRAME_KIND_START_EPOCH:
		return new(cohortv1.StartEpoch)
	case cohortv1.FrameKind_FRAME_KIND_SYNC:
		return new(cohortv1.Sync)
	case cohortv1.FrameKind_FRAME_KIND_UPDATE:
		return new(cohortv1.Update)
	case cohortv1.FrameKind_FRAME_KIND_THROTTLE:
		return new(cohortv1.Throttle)
	case cohortv1.FrameKind_FRAME_KIND_SET_GLOBAL_STEP:
		return new(cohortv1.SetGlobalStep)
	case cohortv1.FrameKind_FRAME_KIND_CHECKPOINT:
		return new(cohortv1.Checkpoint)
	case cohortv1.FrameKind_FRAME_KIND_EVALUATE:
		return new(cohortv1.Evaluate)
	case cohortv1.FrameKind_FRAME_KIND_EXTEND_PARTITION:
		return new(cohortv1.ExtendPartition)
	case cohortv1.FrameKind_FRAME_KIND_DECLARE_DEAD:
		return new(cohortv1.DeclareDead)
	case cohortv1.FrameKind_FRAME_KIND_REQUEST_SESSION_ID:
		return new(cohortv1.RequestSessionId)
	case cohortv1.FrameKind_FRAME_KIND_NEW_SESSION:
		return new(cohortv1.NewSession)
	case cohortv1.FrameKind_FRAME_KIND_SET_EPOCH_CALLBACK_ROLE:
		return new(cohortv1.SetEpochCallbackRole)
	case cohortv1.FrameKind_FRAME_KIND_SHUTDOWN:
		return new(cohortv1.Shutdown)
	case cohortv1.FrameKind_FRAME_KIND_SHUTDOWN_WITH_SAVE:
		return new(cohortv1.ShutdownWithSave)
	case cohortv1.FrameKind_FRAME_KIND_COORDINATOR_HEARTBEAT:
		return new(cohortv1.CoordinatorHeartbeat)
	case cohortv1.FrameKind_FRAME_KIND_ADMIT:
		return new(cohortv1.Admit)

	case cohortv1.FrameKind_FRAME_KIND_READY:
		return new(cohortv1.Ready)
	case cohortv1.FrameKind_FRAME_KIND_BATCH:
		return new(cohortv1.Batch)
	case cohortv1.FrameKind_FRAME_KIND_SYNC_ACK:
		return new(cohortv1.SyncAck)
	case cohortv1.FrameKind_FRAME_KIND_HEARTBEAT:
		return new(cohortv1.Heartbeat)
	case cohortv1.FrameKind_FRAME_KIND_SNAPSHOT_READY:
		return new(cohortv1.SnapshotReady)
	case cohortv1.FrameKind_FRAME_KIND_EVAL_RESULT:
		return new(cohortv1.EvalResult)
	case cohortv1.FrameKind_FRAME_KIND_CHECKPOINT_RESULT:
		return new(cohortv1.CheckpointResult)
	case cohortv1.FrameKind_FRAME_KIND_SESSION_ID_GENERATED:
		return new(cohortv1.SessionIdGenerated)
	case cohortv1.FrameKind_FRAME_KIND_EPOCH_FN_ELAPSED:
		return new(cohortv1.EpochFnElapsed)
	case cohortv1.FrameKind_FRAME_KIND_RESOURCE_SAMPLE:
		return new(cohortv1.ResourceSample)
	case cohortv1.FrameKind_FRAME_KIND_EXITING:
		return new(cohortv1.Exiting)
	case cohortv1.FrameKind_FRAME_KIND_METRICS:
		return new(cohortv1.Metrics)
	}
	return nil
}

// kindOf is newMessage's inverse: the kind that carries msg's type, or
// FRAME_KIND_UNSPECIFIED for any other message (nil included).
func kindOf(msg proto.Message) cohortv1.FrameKind {
	switch msg.(type) {
	case *cohortv1.StartEpoch:
		return cohortv1.FrameKind_FRAME_KIND_START_EPOCH
	case *cohortv1.Sync:
		return cohortv1.FrameKind_FRAME_KIND_SYNC
	case *cohortv1.Update:
		return cohortv1.FrameKind_FRAME_KIND_UPDATE
	case *cohortv1.Throttle:
		return cohortv1.FrameKind_FRAME_KIND_THROTTLE
	case *cohortv1.SetGlobalStep:
		return cohortv1.FrameKind_FRAME_KIND_SET_GLOBAL_STEP
	case *cohortv1.Checkpoint:
		return cohortv1.FrameKind_FRAME_KIND_CHECKPOINT
	case *cohortv1.Evaluate:
		return cohortv1.FrameKind_FRAME_KIND_EVALUATE
	case *cohortv1.ExtendPartition:
		return cohortv1.FrameKind_FRAME_KIND_EXTEND_PARTITION
	case *cohortv1.DeclareDead:
		return cohortv1.FrameKind_FRAME_KIND_DECLARE_DEAD
	case *cohortv1.RequestSessionId:
		return cohortv1.FrameKind_FRAME_KIND_REQUEST_SESSION_ID
	case *cohortv1.NewSession:
		return cohortv1.FrameKind_FRAME_KIND_NEW_SESSION
	case *cohortv1.SetEpochCallbackRole:
		return cohortv1.FrameKind_FRAME_KIND_SET_EPOCH_CALLBACK_ROLE
	case *cohortv1.Shutdown:
		return cohortv1.FrameKind_FRAME_KIND_SHUTDOWN
	case *cohortv1.ShutdownWithSave:
		return cohortv1.FrameKind_FRAME_KIND_SHUTDOWN_WITH_SAVE
	case *cohortv1.CoordinatorHeartbeat:
		return cohortv1.FrameKind_FRAME_KIND_COORDINATOR_HEARTBEAT
	case *cohortv1.Admit:
		return cohortv1.FrameKind_FRAME_KIND_ADMIT

	case *cohortv1.Ready:
		return cohortv1.FrameKind_FRAME_KIND_READY
	case *cohortv1.Batch:
		return cohortv1.FrameKind_FRAME_KIND_BATCH
	case *cohortv1.SyncAck:
		return cohortv1.FrameKind_FRAME_KIND_SYNC_ACK
	case *cohortv1.Heartbeat:
		return cohortv1.FrameKind_FRAME_KIND_HEARTBEAT
	case *cohortv1.SnapshotReady:
		return cohortv1.FrameKind_FRAME_KIND_SNAPSHOT_READY
	case *cohortv1.EvalResult:
		return cohortv1.FrameKind_FRAME_KIND_EVAL_RESULT
	case *cohortv1.CheckpointResult:
		return cohortv1.FrameKind_FRAME_KIND_CHECKPOINT_RESULT
	case *cohortv1.SessionIdGenerated:
		return cohortv1.FrameKind_FRAME_KIND_SESSION_ID_GENERATED
	case *cohortv1.EpochFnElapsed:
		return cohortv1.FrameKind_FRAME_KIND_EPOCH_FN_ELAPSED
	case *cohortv1.ResourceSample:
		return cohortv1.FrameKind_FRAME_KIND_RESOURCE_SAMPLE
	case *cohortv1.Exiting:
		return cohortv1.FrameKind_FRAME_KIND_EXITING
	case *cohortv1.Metrics:
		return cohortv1.FrameKind_FRAME_KIND_METRICS
	}
	return cohortv1.FrameKind_FRAME_KIND_UNSPECIFIED
}

// toRank reports whether kind flows coordinator -> rank.
func toRank(kind cohortv1.FrameKind) bool { return uint32(kind) < kindRankBase }
